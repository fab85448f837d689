"""Speed benchmarks of define-fairseq (CPU). Run ``make bench`` or ``python -m benchmarks.<name>``.

Importing this package sets ``OMP_WAIT_POLICY=PASSIVE`` (unless it is already set) before torch is loaded.
With GNU OpenMP's default spin-then-wait policy, on a machine whose cores are also busy with other processes,
every parallel region can wait a whole scheduler time slice for a descheduled sibling thread (a 192 x 512 x 512
``addmm`` went from 0.8 ms to 16 ms with 2 threads on a busy 2-core machine), which swamps the timings of models
made of many small operations. Passive waiting keeps the numbers close to what the operations cost. Set the
variable yourself (e.g. ``OMP_WAIT_POLICY=ACTIVE``) to override; the results files record the value used.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
