"""The repository's own machinery, run from the repository's root as ``python -m scripts.<name>`` and not installed
with the plugin (setup.py packages ``define_fairseq`` alone): the examples' comparison runner (``compare_runs``,
``run_points``, ``equal_params``), the results tables of the READMEs (``render_results``, ``make results``) and the
builders of the demo's and the examples' corpora (``demo_corpus``, ``doc_corpus``, ``package_corpus``). The
commands a user of the plugin runs are in ``define_fairseq.tools``."""
