"""examples/torch_train.py is a plain PyTorch script plus one wrapping line: run it, and run it without that line,
and compare what they print (the loss of every epoch within 1e-4 relative, the same test accuracy)."""
import re
import subprocess
import sys

from conftest import ROOT

EXAMPLE = ROOT / "examples" / "torch_train.py"


def run(path, env):
    out = subprocess.run([sys.executable, str(path), "4"], check=True, capture_output=True, text=True, env=env).stdout
    losses = [float(v) for v in re.findall(r"^epoch \d+ loss (\S+)$", out, re.M)]
    accuracy = float(re.search(r"^test accuracy (\S+)$", out, re.M).group(1))
    return losses, accuracy


def test_example_equals_the_plain_script(python_env, tmp_path):
    source = EXAMPLE.read_text().splitlines(keepends=True)
    wrapping = [line for line in source if "onnxtrain" in line and not line.lstrip().startswith(("#", "\""))]
    # The import and the wrapping line are all that differ from a plain PyTorch script.
    assert [line.strip() for line in wrapping] == [
        "import onnxtrain.torch", "model = onnxtrain.torch.TrainModule(model)  # the only onnxtrain line"]
    plain = tmp_path / "plain.py"
    plain.write_text("".join(line for line in source if line not in wrapping))

    losses, accuracy = run(EXAMPLE, python_env)
    ref_losses, ref_accuracy = run(plain, python_env)
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, losses  # it trains
    for got, ref in zip(losses, ref_losses):
        assert abs(got - ref) <= 1e-4 * abs(ref), (losses, ref_losses)
    assert accuracy == ref_accuracy and accuracy > 0.9
