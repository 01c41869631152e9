"""The commands that measure, beside the notebook. Run them from the repository's root,
on a GPU but where said; each writes results/<gpu>/:

    python -m benchmarks.host_cost OLD.ipynb   the launch path's host time per call
    python -m benchmarks.sweep                 every launch configuration
    python -m benchmarks.t4_code               the T4's sm_75 builds, run on this GPU
    python -m benchmarks.model                 the model patch in QLoRA steps, prefill
    python -m benchmarks.headline results/GPU  (no GPU) the README's headline block

cells.py loads the notebook's cells as a module, for these and the tests.
"""
