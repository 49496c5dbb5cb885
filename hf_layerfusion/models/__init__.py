"""The families, one module each. Importing this package imports every module in it, so that each family registers
itself (`hf_layerfusion.modeling.registry.register_family`) without being listed anywhere else."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
