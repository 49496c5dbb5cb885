"""The command-line tools users run, each a console script (setup.cfg `[options.entry_points]`) and a module
(`python -m hf_layerfusion.cli.translate`); `examples/<name>.py` of a checkout is a link to the module of that name, so
that `python examples/translate.py` keeps working without installing. Nothing here is imported by the package itself.

Each module's `build_parser()` is the command's parser. The console scripts are the launchers of `hf_layerfusion_cli`,
a module beside the package: importing anything of the package imports torch and transformers first (the package
registers its families with transformers' Auto classes), seconds before a help can print, so the launchers print
`--help` from a cache of what that parser printed, after the first time, and hand any other command line to the
command. `python -m` and `examples/` import the package first and render the help every time."""
