"""``llmsim catalog import-hf FILE``: a model entry from a Hugging Face ``config.json``."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console

from llmsim import hf_config, loader
from llmsim.errors import UserError
from llmsim.specs import Model


def import_hf(file: Path | None, name: str | None, out_path: Path | None,
              console: Console) -> None:
    """Read ``file``, check the model it describes, and print it as catalog YAML (or write
    it to ``out_path``) with its parameter count."""
    if file is None:
        raise UserError("catalog import-hf: give the config.json to read, e.g. llmsim catalog "
                        "import-hf path/to/config.json")
    fields = hf_config.model_fields(file, name)
    model = loader.validate(Model, fields, file.name)
    text = (f"# {model.name}: {model.params / 1e9:.3f} B parameters as llmsim counts them\n"
            + yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, width=100))
    if out_path is None:
        console.print(text, highlight=False, markup=False, soft_wrap=True, end="")
        return
    try:
        out_path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out {str(out_path)!r}: cannot write there ({exc.strerror}); give "
                        "a file path you can write to") from None
    console.print(f"wrote {out_path} ({model.params / 1e9:.3f} B parameters); use it with "
                  f"'model: {{from_hf: {file}}}' in a scenario, or copy it into the catalog's "
                  "workloads/models/", highlight=False, markup=False, soft_wrap=True)
