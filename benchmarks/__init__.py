"""Speed benchmarks of define-fairseq (CPU). Run ``make bench`` or ``python -m benchmarks.<name>``.

The benchmarks leave ``OMP_WAIT_POLICY`` as the environment has it, so they measure what a user's run gets: unset,
GNU OpenMP's threads spin briefly at the end of a parallel region and then sleep. On a machine whose cores are busy
with other processes, set ``OMP_WAIT_POLICY=PASSIVE``: with spinning, a parallel region can wait a whole scheduler
time slice for a descheduled sibling thread (a 192 x 512 x 512 ``addmm`` went from 0.8 ms to 16 ms with 2 threads
on a busy 2-core machine). On an idle machine PASSIVE costs a thread wake-up per parallel region instead, which
adds up for code made of many small operations (about 300 ms of a 1.1 s Transformer-XL evaluation segment). The
results files record the value used.
"""
