"""drafter"""
