"""Slurm batch jobs: ``unirank sbatch``'s job spec (spec, config), its script (script), the
Slurm commands (commands), following a job (follow), the stop/requeue rules (requeue) and a
batch step's rendezvous (jobenv). Run by the ``unirank`` parent and, for requeue, by the
ranks; nothing here imports torch."""
