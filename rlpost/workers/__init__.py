"""The Ray side of the workers: thin actor shells that each hold one engine
(``rollout_worker``, ``trainer_worker`` with its ``TrainerGroup``,
``reward_model_worker``) and the placement groups that say where they run
(``placement``).

May import: ``rlpost.config``, ``rlpost.rewards``, ``rlpost.rollout``,
``rlpost.trainers``, ray.
"""

# Set in every worker process from its start (before its arguments are
# unpickled, which imports the engines): what vLLM, Triton and torch print there
# that a user cannot act on -- vLLM's INFO/WARNING lines on each reload, Triton's
# "no CPU backend", torch's NUMA-binding note, a deprecation inside vLLM.
WORKER_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONWARNINGS": "ignore::FutureWarning:vllm.triton_utils.dispatcher",
}
