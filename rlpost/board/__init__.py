"""``rlpost board``: a local web UI over a folder of run directories.

Pages: the runs (status, headline figures), a run's live curves (several runs
overlaid), the rollout dumps of ``trainer.log_samples`` and a launch form that
composes and validates a run as the CLI does. aiohttp serves server-rendered
HTML; ``board.js`` draws the curves as SVG. See docs/board.md.
"""
