"""eagle_assets: a target LLM in, a served and measured EAGLE-3 drafter out."""

from eagle_assets.engines.cpu_isa import apply_cap

# EAGLE_ASSETS_CPU_ISA caps torch's and oneDNN's kernels through variables they read at their first
# kernel dispatch: set them before any of the package's code computes.
apply_cap()
