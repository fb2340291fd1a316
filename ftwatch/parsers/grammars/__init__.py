"""Grammars parsed once at load time (pyparsing); never run per log line (SPEC P4)."""
