#!/usr/bin/env python3
"""Draws assets/icon.png (256x256): a rounded speech bubble with three dots. Standard library
only, so the icon can be regenerated anywhere."""
import struct
import zlib

SIZE = 256
BG = (0, 0, 0, 0)
BUBBLE = (52, 120, 220, 255)
DOT = (255, 255, 255, 255)


def inside_rounded_rect(x, y, x0, y0, x1, y1, r):
    cx = min(max(x, x0 + r), x1 - r)
    cy = min(max(y, y0 + r), y1 - r)
    return x0 <= x <= x1 and y0 <= y <= y1 and (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def inside_tail(x, y):
    # A triangle below the bubble's lower left.
    return 176 <= y <= 226 and 60 <= x <= 60 + (226 - y) * 1.0 + 10 and x >= 60 + (y - 176) * 0.3


def pixel(x, y):
    for cx in (88, 128, 168):
        if (x - cx) ** 2 + (y - 112) ** 2 <= 14 ** 2:
            return DOT
    if inside_rounded_rect(x, y, 24, 40, 232, 184, 40) or inside_tail(x, y):
        return BUBBLE
    return BG


rows = b"".join(
    b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(SIZE)) for y in range(SIZE)
)


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


png = (
    b"\x89PNG\r\n\x1a\n"
    + chunk(b"IHDR", struct.pack(">IIBBBBB", SIZE, SIZE, 8, 6, 0, 0, 0))
    + chunk(b"IDAT", zlib.compress(rows, 9))
    + chunk(b"IEND", b"")
)
with open("assets/icon.png", "wb") as f:
    f.write(png)
