"""The one version string of mmptm (the package, its wheel and `mmptm --version`)."""

__version__ = "0.1.0"
