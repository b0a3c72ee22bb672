"""corpus tests"""
