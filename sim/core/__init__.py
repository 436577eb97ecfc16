"""The schedule itself: the key codec, the IR, its compiled arrays and checks, the list scheduler, lowering passes.

Nothing here imports the engines, results or anything above them.
"""
