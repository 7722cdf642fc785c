"""replaceme-exp: training-free depth pruning experiments (ReplaceMe and baselines).

The package layout follows the pipeline:
data -> capture -> selection -> estimation -> surgery -> evaluation -> results.
"""

__version__ = "0.1.0"
