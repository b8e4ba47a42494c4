"""Tests of infra.inference (a package so its module names never collide with other test dirs)."""
