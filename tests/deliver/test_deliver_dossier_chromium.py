"""The HTML dossier rendered by headless Chromium: the screenshot is not empty, the page logs no
console message, and every plot is an image that decodes (one page render).

Needs /usr/bin/chromium (Debian: ``apt-get install -y chromium``); skipped without it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium not found at /usr/bin/chromium (apt-get install -y chromium)")

# appended to a copy of the page: the dossier itself has no script
HARNESS = """<script>
window.addEventListener('error', function (e) { console.log('TUNEPROOF-ERROR ' + e.message); });
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0 && i.naturalHeight > 0; }).length;
  console.log('TUNEPROOF-IMAGES ' + imgs.length + ' ' + ok);
});
</script>"""


def test_dossier_renders_in_headless_chromium(dossier_study, tmp_path):
    from PIL import Image

    page = tmp_path / "dossier.html"
    page.write_text(dossier_study["html"].replace("</body>", HARNESS + "</body>"))
    shot = tmp_path / "shot.png"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
           "--v=0", "--window-size=1200,3000", f"--screenshot={shot}", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    counts = [re.search(r"TUNEPROOF-IMAGES (\d+) (\d+)", line) for line in console]
    counts = [m for m in counts if m]
    assert counts, f"no harness output (exit {proc.returncode}):\n" + "\n".join(proc.stderr.splitlines()[-15:])
    total, decoded = int(counts[0].group(1)), int(counts[0].group(2))
    assert total == decoded == 6  # loss curves, per-class bars, 2 confusion matrices, token lengths, memory/throughput
    assert [line for line in console if "TUNEPROOF-IMAGES" not in line] == []  # no console error or warning
    img = Image.open(shot).convert("L")
    assert img.size == (1200, 3000)
    hist = img.histogram()
    assert sum(hist[:250]) > 0.02 * img.size[0] * img.size[1]  # text, tables and plots, not a blank page
