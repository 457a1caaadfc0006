"""Starting jobs: a local multi-process launcher (launch/local.py) and SLURM batch templates (launch/slurm/)."""
