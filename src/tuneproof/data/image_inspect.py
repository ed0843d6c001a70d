"""``data inspect`` for images: per class, the original image and the tensor the model receives,
from the one :class:`~tuneproof.data.image_pipeline.ImagePipeline` (so what is shown is what the
trainer feeds, the train-time flip included on the train split)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from tuneproof.data.examples import Example
from tuneproof.data.image_pipeline import ImageEncoded
from tuneproof.ui import html_text

SHOW_PX = 96  # side of the pictures on the page; small images are enlarged without smoothing (NEAREST)


def describe(example: Example, enc: ImageEncoded, classes: list[str]) -> list[str]:
    """Plain lines for the terminal: class index and name, original form, the tensor and its range."""
    x = enc.pixel_values
    w, h = enc.original_size
    lines = [
        f"{example.id}  class {enc.class_index} = '{enc.category}' (of "
        f"{len(classes)}); the head is trained on this index",
        f"  original {w}x{h} {enc.original_mode} {example.meta.get('format', '')}, {example.meta.get('bytes', 0)} bytes"
        + ("; mirrored (data.image.horizontal_flip)" if enc.flipped else ""),
        f"  model input pixel_values {list(x.shape)} float32, range ["
        f"{float(x.min()):.3f}, {float(x.max()):.3f}]; per channel mean "
        + ", ".join(f"{float(c.mean()):.3f}" for c in x),
    ]
    return lines + [f"  note: {n}" for n in enc.notes] + [f"  FAULT: {f}" for f in enc.faults]


def _png(im: Image.Image) -> str:
    scale = max(1, SHOW_PX // max(im.width, im.height))
    im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def tensor_image(x) -> Image.Image:
    """The ``[C, H, W]`` tensor as a picture: each channel min-max scaled to 0-255 (3 channels as RGB)."""
    a = x.detach().cpu().numpy().astype(np.float64)
    lo, hi = a.min(), a.max()
    a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    a = (a * 255).round().astype(np.uint8)
    return Image.fromarray(a.transpose(1, 2, 0) if a.shape[0] == 3 else a[0], mode="RGB" if a.shape[0] == 3 else "L")


def render_html(items: list[tuple[Example, ImageEncoded, Image.Image]], title: str, classes: list[str]) -> str:
    """One self-contained page (inline PNGs, no script); every text is escaped."""
    rows = []
    for ex, enc, original in items:
        text = "<br>".join(html_text(line) for line in describe(ex, enc, classes))
        rows.append(
            f"<tr><td><img alt='original' src='{_png(original)}'></td><td><img alt='model "
            f"input' src='{_png(tensor_image(enc.pixel_values))}'>"
            f"</td><td style='font-family:monospace;font-size:12px'>{text}</td></tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>" + html_text(title) + "</title></head><body>"
        f"<h1>{html_text(title)}</h1><p>Left: the file as decoded (EXIF "
        "orientation applied). Middle: the tensor the model "
        "receives after the study's transforms and the image processor, each "
        "channel scaled to its own min-max for display. "
        "Right: class index, original form, tensor shape and range.</p><table>"
        + "".join(rows)
        + "</table></body></html>"
    )
