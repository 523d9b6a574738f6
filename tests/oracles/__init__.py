"""Slow, obviously right answers that tests compare fast code against."""
