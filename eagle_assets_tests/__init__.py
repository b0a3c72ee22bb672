"""eagle_assets_tests"""
