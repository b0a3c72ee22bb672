"""Tests of eagle_assets.bench."""
