"""Old module paths (pipesim 0.2's flat layout) as thin aliases of their new homes, for one release.

``import sim.fastpath`` still works: it warns (:class:`DeprecationWarning`, naming the new path) and gives the
module that now lives at ``sim.engines.fastpath`` itself, not a copy, so classes and module state stay one.
``python -m OLD.PATH`` runs the new module too. The aliases go in pipesim 0.4.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Mapping

__all__ = ["SIM_MOVED", "install"]

REMOVED_IN = "0.4"

SIM_MOVED: dict[str, str] = {
    "sim.commands": "sim.cli",
    "sim.commands.options": "sim.cli.options",
    "sim.commands.simulate": "sim.cli.simulate",
    "sim.commands.demo": "sim.cli.demo",
    "sim.commands.export": "sim.cli.export",
    "sim.commands.gantt": "sim.cli.gantt",
    "sim.commands.sweep": "sim.cli.sweep",
    "sim.commands.notebooks": "sim.cli.notebooks",
    "sim.commands.collective": "sim.cli.collective",
    "sim.commands.partition": "sim.cli.partition",
    "sim.commands.replicate": "sim.cli.replicate",
    "sim.commands.ingest": "sim.cli.ingest",
    "sim.commands.estimate": "sim.cli.estimate",
    "sim.commands.plan": "sim.cli.plan",
    "sim.ir": "sim.core.ir",
    "sim.compiled": "sim.core.compiled",
    "sim.wavefront": "sim.core.wavefront",
    "sim.config": "sim.core.config",
    "sim.passes": "sim.core.passes",
    "sim.plan": "sim.engines.plan",
    "sim.engine": "sim.engines.simpy_engine",
    "sim.fastpath": "sim.engines.fastpath",
    "sim.replication": "sim.engines.replication",
    "sim.collectives": "sim.engines.collectives",
    "sim.pytorch_format": "sim.io.schedule_io",
    "sim.exports": "sim.io.timeline_io",
    "sim.trace": "sim.io.trace",
    "sim.plots": "sim.io.plots",
    "sim.sweep_plots": "sim.io.sweep_plots",
    "sim.cost": "sim.model.cost",
    "sim.hardware": "sim.model.hardware",
    "sim.layers": "sim.model.layers",
    "sim.partition": "sim.model.partition",
    "sim.gpus": "sim.model.gpus",
    "sim.models": "sim.model.models",
    "sim.estimate": "sim.model.estimate",
    "sim.timeline": "sim.results.timeline",
    "sim.memory": "sim.results.memory",
    "sim.memory_kernel": "sim.results.memory_kernel",
    "sim.memory_breakdown": "sim.results.memory_breakdown",
    "sim.metrics": "sim.results.metrics",
    "sim.result": "sim.results.result",
    "sim.generators": "sim.schedules.registry",
    "sim.generators.common": "sim.schedules.common",
    "sim.closed_forms": "sim.schedules.closed_forms",
    "sim.batch": "sim.search.batch",
    "sim.sweep": "sim.search.sweep",
    "sim.planner": "sim.search.planner",
    "sim.generators.naive": "sim.schedules.generators.naive",
    "sim.generators.gpipe": "sim.schedules.generators.gpipe",
    "sim.generators.one_f_one_b": "sim.schedules.generators.one_f_one_b",
    "sim.generators.pipedream": "sim.schedules.generators.pipedream",
    "sim.generators.pipedream_2bw": "sim.schedules.generators.pipedream_2bw",
    "sim.generators.interleaved_1f1b": "sim.schedules.generators.interleaved_1f1b",
    "sim.generators.zb_h1": "sim.schedules.generators.zb_h1",
    "sim.generators.zb_h2": "sim.schedules.generators.zb_h2",
    "sim.generators.zbv": "sim.schedules.generators.zbv",
    "sim.generators.dualpipev": "sim.schedules.generators.dualpipev",
}
"""old module path -> new module path"""


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (imported if needed)."""

    def __init__(self, new: str):
        self.new = new
        self.own_spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.own_spec  # the import system stamped the old name's spec on it: give its own back

    def get_code(self, fullname: str):
        """For ``python -m OLD.PATH`` (runpy reads the code and runs it as ``__main__``)."""
        return importlib.util.find_spec(self.new).loader.get_code(self.new)


class _MovedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, moved: Mapping[str, str]):
        self.moved = dict(moved)

    def find_spec(self, fullname, path=None, target=None):
        new = self.moved.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} moved to {new} (pipesim's package layout); the old path goes in pipesim "
                      f"{REMOVED_IN}", DeprecationWarning, stacklevel=2)
        real = importlib.util.find_spec(new)
        # an old package (sim.generators, whose modules moved too) stays one: its old submodules import through it
        package = real.submodule_search_locations is not None or any(k.startswith(fullname + ".") for k in self.moved)
        return importlib.util.spec_from_loader(fullname, _Alias(new), is_package=package)


def install(moved: Mapping[str, str]) -> None:
    """Serve every old path of *moved* from its new one (idempotent; first on the finder list, so an old
    package path such as ``sim.commands.gantt`` is caught before the regular finders try it)."""
    for finder in sys.meta_path:
        if isinstance(finder, _MovedFinder):
            finder.moved.update(moved)
            return
    sys.meta_path.insert(0, _MovedFinder(moved))
