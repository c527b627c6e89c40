"""Fail-slow: a run that still beats but has become much slower than its own pace."""
