"""Shared references for the tests: independent implementations the tests compare zmat against."""
