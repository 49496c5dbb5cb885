"""The command-line tools users run, each a console script (setup.cfg `[options.entry_points]`) and a module
(`python -m hf_layerfusion.cli.translate`); `examples/<name>.py` of a checkout is a link to the module of that name, so
that `python examples/translate.py` keeps working without installing. Nothing here is imported by the package itself."""
