"""resmlp: ResMLP and MLP-Mixer in PyTorch, with the paper's training, analyses and fast inference.

Importing the package is cheap (the command line's --help must not load torch): the public names and the
submodules (resmlp.inference, resmlp.train, resmlp.transfer, ...) are loaded on first use. Our presets are
registered with timm as soon as timm is imported, whether that happens before or after `import resmlp`, so
`timm.create_model("resmlp_s12")` works after `import resmlp`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "ResMLP": "resmlp.models", "ResMLPConfig": "resmlp.models", "create_model": "resmlp.models",
    "list_models": "resmlp.models", "export_checkpoint": "resmlp.checkpoint", "load": "resmlp.checkpoint",
    "load_checkpoint": "resmlp.checkpoint", "read_metadata": "resmlp.checkpoint", "save": "resmlp.checkpoint",
    "fuse": "resmlp.folding",
}
_SUBMODULES = ("analysis", "build", "checkpoint", "complexity", "data", "evaluation", "export", "folding", "hostinfo",
               "inference", "layers", "models", "preprocess", "reporting", "runtime", "seq2seq", "train", "transfer")
__all__ = sorted(_EXPORTS)


def _no_cuda_runtime_line(record: logging.LogRecord) -> bool:
    """False for torch.utils.cpp_extension's "No CUDA runtime is found, using CUDA_HOME=..." (issue 57 item 4):
    logged when torch.compile's C++ backend is imported on a host without a usable GPU (a CPU-only host with a
    CUDA toolkit installed), where it says nothing the user can act on; every other record passes."""
    return not str(record.msg).startswith("No CUDA runtime is found")


logging.getLogger("torch.utils.cpp_extension").addFilter(_no_cuda_runtime_line)  # no torch import: a name only


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"resmlp.{name}")
    else:
        raise AttributeError(f"module 'resmlp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


def _register_with_timm() -> None:
    """Importing resmlp.models.pretrained registers the presets (its last line). While our own model
    modules are being imported (they import timm themselves) that is on its way and must not start early."""
    if any(name == "resmlp.layers" or name.startswith("resmlp.models")
           for name, module in list(sys.modules.items())
           if getattr(getattr(module, "__spec__", None), "_initializing", False)):
        return
    importlib.import_module("resmlp.models.pretrained")


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    """Registers our presets right after `timm` finishes importing. Python has no post-import hook, so this
    finder wraps timm's own loader; it removes itself once it has fired."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "timm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("timm")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_with_timm()

        spec.loader.exec_module = exec_then_register
        return spec


if "timm" in sys.modules:
    _register_with_timm()
elif not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTimmImport())
