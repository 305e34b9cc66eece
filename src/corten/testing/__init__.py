"""Test harness for Corten lowering rules and programs."""
from corten.testing.tester import DialectReport, Tester

__all__ = ["DialectReport", "Tester"]
