"""specbundle's bundler: Kitfile -> layers -> manifest -> signature -> store / registry -> verify -> unpack."""

__version__ = "0.1.0"
