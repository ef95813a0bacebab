"""docs/cli.md's plot one-liner, run exactly as written on a metrics file from a real `onnxtrain train`."""
import re
import shlex
import subprocess
import sys

from conftest import ROOT


def test_plot_one_liner_writes_a_png(tmp_path, build_dir):
    subprocess.run([sys.executable, ROOT / "examples" / "digits" / "make_digits.py", tmp_path / "data"],
                   check=True, capture_output=True)
    (tmp_path / "config.yaml").write_text((ROOT / "examples" / "digits" / "config.yaml").read_text())
    subprocess.run([build_dir / "cli" / "onnxtrain", "train", tmp_path / "config.yaml", "--set", "train.epochs=1",
                    "--set", "output=run"], check=True, capture_output=True)
    metrics = tmp_path / "run" / "metrics.csv"
    doc = (ROOT / "docs" / "cli.md").read_text()
    line = re.search(r"<!-- plot-one-liner -->\n```bash\n(.*)\n```", doc).group(1)
    args = shlex.split(line)
    assert args[0] == ".venv/bin/python" and args[-2:] == ["runs/run/metrics.csv", "loss.png"]
    png = tmp_path / "loss.png"
    subprocess.run([ROOT / ".venv" / "bin" / "python", *args[1:-2], metrics, png], check=True)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
