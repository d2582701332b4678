"""Reproduce published evaluations on the simulator (`splitserve reproduce PAPER`).

Each paper is three modules: PAPER.py (the setup as the paper gives it and where it does not,
and `reproduce_PAPER`), PAPER_experiments.py (scales, simulations, measures) and PAPER_report.py
(plots and report.md, one function per section), for distserve, tetriinfer, ecoserve and aladdin;
Splitwise's are report.py, experiments.py and sections.py. The paper's own figures are in
PAPER_paper.toml (Splitwise's: paper.toml); markdown.py and plots.py are shared."""
