"""Small charts as PNG images, for TensorBoard's Images tab: lines over link rate, grouped bars.

Drawn with Pillow (which TensorBoard itself requires), so no plotting library
is needed.  Pure: figures in, PNG bytes out.  Axes may be logarithmic, because
link rates, step times and latencies span decades.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 900, 540
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 90, 200, 50, 70
#: Series colours, in order (colour-blind safe, Okabe and Ito).
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One line (points ``(x, y)``) or one bar per group (``values``, None for none)."""

    name: str
    points: tuple[tuple[float, float], ...] = ()
    values: tuple[float | None, ...] = ()
    dashed: bool = False
    #: Index into ``COLOURS`` (default: the series' position); ``light`` pales it.
    colour: int | None = None
    light: bool = False

    def fill(self, position: int) -> str:
        """The series' colour as ``#rrggbb``."""
        base = COLOURS[(position if self.colour is None else self.colour) % len(COLOURS)]
        if not self.light:
            return base
        channels = [int(base[i : i + 2], 16) for i in (1, 3, 5)]
        return "#" + "".join(f"{(c + 2 * 255) // 3:02x}" for c in channels)


@dataclass(frozen=True, slots=True, kw_only=True)
class Chart:
    """A PNG image and its size, as the image summary needs them."""

    png: bytes
    width: int
    height: int


class _Axis:
    """Maps data values to pixels along one axis, linear or log10."""

    def __init__(self, low: float, high: float, start: int, end: int, log: bool) -> None:
        self.log = log and low > 0
        if self.log:
            low, high = 10 ** math.floor(math.log10(low)), 10 ** math.ceil(math.log10(high))
            if high == low:
                # One value, a power of ten (one 1 Gbit/s link): a decade around it.
                high = low * 10
        elif high == low:
            high = low + 1
        if not self.log:
            low = min(low, 0.0)
            high = high * 1.08
        self.low, self.high, self.start, self.end = low, high, start, end

    def pixel(self, value: float) -> float:
        if self.log:
            fraction = (math.log10(value) - math.log10(self.low)) / (
                math.log10(self.high) - math.log10(self.low)
            )
        else:
            fraction = (value - self.low) / (self.high - self.low)
        return self.start + fraction * (self.end - self.start)

    def ticks(self) -> list[float]:
        if self.log:
            first, last = round(math.log10(self.low)), round(math.log10(self.high))
            # Few decades: 1, 2 and 5 of each, so the axis still reads.
            multiples = (1, 2, 5) if last - first <= 2 else (1,)
            return [
                m * 10.0**power
                for power in range(first, last + 1)
                for m in multiples
                if m * 10.0**power <= self.high
            ]
        step = _nice_step((self.high - self.low) / 5)
        count = int(self.high // step)
        return [n * step for n in range(int(self.low // step), count + 1) if n * step >= self.low]


def _nice_step(raw: float) -> float:
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for multiple in (1, 2, 5, 10):
        if raw <= multiple * power:
            return multiple * power
    return 10 * power


def format_tick(value: float) -> str:
    """Ticks without trailing zeros: 0.5, 2, 10k, 1M."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:g}{suffix}"
    return f"{value:g}"


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _frame(title: str, x_label: str, y_label: str) -> tuple[Image.Image, ImageDraw.ImageDraw]:
    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((WIDTH / 2, 18), title, fill="black", font=_font(18), anchor="mt")
    draw.text(
        ((MARGIN_LEFT + WIDTH - MARGIN_RIGHT) / 2, HEIGHT - 18),
        x_label,
        fill="black",
        font=_font(14),
        anchor="mb",
    )
    label = Image.new("RGB", (HEIGHT - MARGIN_TOP - MARGIN_BOTTOM, 22), "white")
    ImageDraw.Draw(label).text(
        (label.width / 2, 11), y_label, fill="black", font=_font(14), anchor="mm"
    )
    image.paste(label.rotate(90, expand=True), (6, MARGIN_TOP))
    return image, draw


def _y_grid(draw: ImageDraw.ImageDraw, axis: _Axis) -> None:
    for tick in axis.ticks():
        y = axis.pixel(tick)
        draw.line([(MARGIN_LEFT, y), (WIDTH - MARGIN_RIGHT, y)], fill="#dddddd")
        draw.text(
            (MARGIN_LEFT - 6, y), format_tick(tick), fill="black", font=_font(12), anchor="rm"
        )
    draw.rectangle(
        [(MARGIN_LEFT, MARGIN_TOP), (WIDTH - MARGIN_RIGHT, HEIGHT - MARGIN_BOTTOM)], outline="black"
    )


def _legend(draw: ImageDraw.ImageDraw, series: Sequence[Series]) -> None:
    x = WIDTH - MARGIN_RIGHT + 14
    for number, item in enumerate(series):
        y = MARGIN_TOP + 10 + 22 * number
        draw.rectangle([(x, y - 5), (x + 18, y + 5)], fill=item.fill(number))
        draw.text((x + 24, y), item.name, fill="black", font=_font(13), anchor="lm")


def _png(image: Image.Image) -> Chart:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return Chart(png=buffer.getvalue(), width=image.width, height=image.height)


def _dashed(draw: ImageDraw.ImageDraw, points: Sequence[tuple[float, float]], colour: str) -> None:
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        length = math.hypot(x1 - x0, y1 - y0)
        pieces = max(int(length // 8), 1)
        for piece in range(0, pieces, 2):
            a, b = piece / pieces, min((piece + 1) / pieces, 1.0)
            draw.line(
                [
                    (x0 + (x1 - x0) * a, y0 + (y1 - y0) * a),
                    (x0 + (x1 - x0) * b, y0 + (y1 - y0) * b),
                ],
                fill=colour,
                width=3,
            )


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_log: bool = True,
    y_log: bool = False,
) -> Chart:
    """Lines through each series' points (sorted by x), with markers and a legend."""
    points = [p for item in series for p in item.points]
    if not points:
        raise ValueError("nothing to draw")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    image, draw = _frame(title, x_label, y_label)
    x_axis = _Axis(min(xs), max(xs), MARGIN_LEFT + 20, WIDTH - MARGIN_RIGHT - 20, x_log)
    y_axis = _Axis(min(ys), max(ys), HEIGHT - MARGIN_BOTTOM, MARGIN_TOP, y_log)
    _y_grid(draw, y_axis)
    for tick in sorted({*x_axis.ticks(), *xs}):
        if x_axis.low <= tick <= x_axis.high:
            x = x_axis.pixel(tick)
            draw.line([(x, HEIGHT - MARGIN_BOTTOM), (x, HEIGHT - MARGIN_BOTTOM + 5)], fill="black")
            if tick in xs:
                label = format_tick(tick)
                draw.text(
                    (x, HEIGHT - MARGIN_BOTTOM + 8),
                    label,
                    fill="black",
                    font=_font(12),
                    anchor="mt",
                )
    for number, item in enumerate(series):
        colour = item.fill(number)
        drawn = [(x_axis.pixel(x), y_axis.pixel(y)) for x, y in sorted(item.points)]
        if item.dashed:
            _dashed(draw, drawn, colour)
        elif len(drawn) > 1:
            draw.line(drawn, fill=colour, width=3)
        for x, y in drawn:
            draw.ellipse([(x - 5, y - 5), (x + 5, y + 5)], fill=colour)
    _legend(draw, series)
    return _png(image)


def bar_chart(
    title: str, groups: Sequence[str], series: Sequence[Series], *, y_label: str, y_log: bool = True
) -> Chart:
    """Bars side by side per group (one per series); a missing value leaves a gap."""
    values = [v for item in series for v in item.values if v is not None and v > 0]
    if not values or not groups:
        raise ValueError("nothing to draw")
    image, draw = _frame(title, "", y_label)
    y_axis = _Axis(min(values), max(values), HEIGHT - MARGIN_BOTTOM, MARGIN_TOP, y_log)
    _y_grid(draw, y_axis)
    span = (WIDTH - MARGIN_RIGHT - MARGIN_LEFT) / len(groups)
    bar = span * 0.8 / max(len(series), 1)
    base = HEIGHT - MARGIN_BOTTOM
    for group_number, group in enumerate(groups):
        left = MARGIN_LEFT + group_number * span + span * 0.1
        draw.text((left + span * 0.4, base + 8), group, fill="black", font=_font(13), anchor="mt")
        for number, item in enumerate(series):
            value = item.values[group_number] if group_number < len(item.values) else None
            if value is None or value <= 0:
                continue
            top = y_axis.pixel(value)
            x = left + number * bar
            draw.rectangle([(x, top), (x + bar - 2, base)], fill=item.fill(number))
    _legend(draw, series)
    return _png(image)
