"""eagle_assets: a target LLM in, a served and measured EAGLE-3 drafter out."""
