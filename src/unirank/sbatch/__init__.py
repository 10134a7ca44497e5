"""Slurm batch jobs: ``unirank sbatch``'s job spec (spec, config), its options (options), its
script (script), the Slurm commands (commands), following a job (follow) and a batch step's
rendezvous (jobenv). Run by the ``unirank`` parent and the batch shell; nothing here imports
torch. The requeue rules a rank follows are :mod:`unirank.requeue`'s; nothing outside this
package imports it."""
