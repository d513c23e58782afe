"""Launchers for the services the tests, CI and demo use, and deployment files."""
