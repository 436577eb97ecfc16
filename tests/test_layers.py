"""Per-layer cost tables: reading, writing, errors."""

import pytest

from sim.model.layers import LayerCosts, LayersError, load_layers, save_layers


def test_round_trip(tmp_path):
    layers = LayerCosts(forward=[1, 2.5], backward=[2, 5], activation_bytes=[10, 0], parameter_bytes=[3, 4],
                        names=["embed", "head"])
    path = save_layers(layers, tmp_path / "layers.csv", comments=["measured on nothing"])
    assert path.read_text().startswith("# measured on nothing\nlayer,forward,backward,activation_bytes,parameter_bytes")
    assert load_layers(path) == layers
    assert layers.compute == (3.0, 7.5)


def test_defaults():
    layers = LayerCosts(forward=[1, 1, 1], backward=[2, 2, 2])
    assert layers.names == ("layer0", "layer1", "layer2") and layers.parameter_bytes == (0.0,) * 3


@pytest.mark.parametrize("text, match", [
    ("", "empty"),
    ("layer,forward\nx,1\n", "header"),
    ("layer,forward,backward,activation_bytes,parameter_bytes\nx,1,2,3\n", "row 2 has 4 cells"),
    ("layer,forward,backward,activation_bytes,parameter_bytes\nx,1,two,3,4\n", "'backward': 'two' is not a number"),
    ("layer,forward,backward,activation_bytes,parameter_bytes\nx,1,-2,3,4\n", r"backward\[0\] = -2.0"),
    ("layer,forward,backward,activation_bytes,parameter_bytes\n", "at least one layer"),
])
def test_errors_name_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(LayersError, match=match):
        load_layers(path)


def test_missing_file(tmp_path):
    with pytest.raises(LayersError, match="cannot read"):
        load_layers(tmp_path / "nope.csv")


def test_profile_sequential_measures_every_layer():
    torch = pytest.importorskip("torch")
    from validate.predict.profile_layers import profile_sequential

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    layers = profile_sequential(model, torch.randn(4, 16), repeats=2, warmup=1)
    assert layers.layers == 3
    assert layers.names[0].startswith("0:Linear")
    assert layers.parameter_bytes == ((16 * 32 + 32) * 4, 0.0, (32 * 8 + 8) * 4)
    assert layers.activation_bytes == (4 * 32 * 4, 4 * 32 * 4, 4 * 8 * 4)
    assert all(t > 0 for t in layers.forward) and all(t > 0 for t in layers.backward)
