"""Numbers with their units, for every text a report prints (``30,102 cycles``, ``20.07 us``, ``150.3 GB/s``).

Decimal prefixes for rates (GB/s, TFLOP/s, as chip data sheets give them), binary ones for sizes (KiB, MiB).
"""

from __future__ import annotations

__all__ = ["bytes_", "cycles", "flop_rate", "flops", "intensity", "percent", "rate", "seconds"]


def cycles(n: float | None) -> str:
    if n is None:
        return "n/a"
    return "1 cycle" if n == 1 else f"{n:,.0f} cycles"


def seconds(s: float | None) -> str:
    """Seconds in the largest unit that keeps the number at least 1 (ns, us, ms, s)."""
    if s is None:
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
        if abs(s) >= scale:
            return f"{s / scale:,.2f} {unit}"
    return f"{s / 1e-9:,.2f} ns"


def bytes_(n: float | None) -> str:
    if n is None:
        return "n/a"
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def rate(bytes_per_s: float | None) -> str:
    """A bandwidth in GB/s (10^9 bytes per second)."""
    return "n/a" if bytes_per_s is None else f"{bytes_per_s / 1e9:,.1f} GB/s"


def flops(n: float | None) -> str:
    if n is None:
        return "n/a"
    for scale, unit in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def flop_rate(per_s: float | None) -> str:
    """A compute rate in TFLOP/s (10^12 floating-point operations per second)."""
    return "n/a" if per_s is None else f"{per_s / 1e12:,.3f} TFLOP/s"


def intensity(flop_per_byte: float | None) -> str:
    return "n/a" if flop_per_byte is None else f"{flop_per_byte:,.2f} FLOP/B"


def percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"
