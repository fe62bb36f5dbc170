"""The calibration file: fitted operator tables as versioned JSON.

Why JSON with a format version: the files are bundled in the package and written by users'
``libra-calibrate fit`` runs; a reader must reject a file it does not understand instead of
mis-reading it, and a person must be able to see where the numbers came from (``source``:
folder, file digests, tool version, time) without git.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cost_models.errors import CostModelError

FORMAT = "libra-operator-calibration"
FORMAT_VERSION = 1


@dataclass
class Calibration:
    """Fitted operator models of one device.

    ``gpu`` is the catalog name of the device the data were measured on (a800 loads the a100
    file and rescales its links). ``families`` maps an operator family (gemm, attn_prefill,
    attn_decode, moe, comm) to its fitted tables, as written by ``cost_models.calibration.fit``.
    """

    gpu: str
    families: dict[str, Any]
    source: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "gpu": self.gpu,
            "source": self.source,
            "families": self.families,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write compact JSON (bundled files must stay small)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Read a file written by ``save``; anything else is a one-line ``CostModelError``."""
        p = Path(path)
        if not p.is_file():
            raise CostModelError(f"{p}: calibration file not found")
        try:
            obj = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CostModelError(f"{p}: not a JSON calibration file ({exc})") from None
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise CostModelError(f"{p}: not a {FORMAT} file (write one with `libra-calibrate fit`)")
        if obj.get("version") != FORMAT_VERSION:
            raise CostModelError(
                f"{p}: calibration format version {obj.get('version')!r}, this Libra reads {FORMAT_VERSION}"
            )
        for key in ("gpu", "families"):
            if key not in obj:
                raise CostModelError(f"{p}: calibration file lacks the {key!r} field")
        return cls(gpu=str(obj["gpu"]), families=dict(obj["families"]), source=dict(obj.get("source", {})))
