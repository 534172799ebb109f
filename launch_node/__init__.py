"""launch's node runtime: what launch itself runs on every node of a run, whatever the job.

    worker.py            where every rank starts (LAUNCH_ATTEMPT, the workdir first on
                         PYTHONPATH, the rank's life tied to its agent), then execs the job
                         in its own folder
    job_folder.py        that folder: a view of the node's copy for one run and node (hard
                         links), old runs' views removed
    rdzv_store.py        the rendezvous store, a process of its own on the head
    node_probe.py        heartbeats, process activity, stack dumps, kills by the run's stamp
    heartbeat.py         each rank's heartbeat file (written by the bundled trainer)
    checkpoint_files.py  the bundled trainer's checkpoint files: names, atomic write, which
                         are complete (the mirror and `--resume` read them too)
    mirror.py            checkpoints mirrored to S3 or a shared folder, and restored
    spot.py              the spot interruption notice, SIGUSR1 to the node's ranks

Every file runs as a script with the node's own interpreter, and imports only the standard
library and this package (rdzv_store.py: torch; mirror.py: boto3 for s3://). Nothing here
imports `train` or `launcher`: the runtime serves a user's own job as well as the trainer.
Named `launch_node`, not `node`, because the wheel installs it at the top of site-packages.
"""
