"""``python -m rlpost.eval [group=option ...] [key=value ...]``"""

from __future__ import annotations

import logging
import sys

USAGE = """usage: python -m rlpost.eval [group=option ...] [key=value ...]

Samples a trained model on the held-out prompts, scores the samples with the
reward and writes pass@k, mean@n, greedy accuracy and maj@k to eval.json and
eval.md (default: <model.path>/eval). It reads the training config (model.path,
data.*, reward.*, rollout.*) and the eval.* keys (docs/evaluation.md).

Examples:
  python -m rlpost.eval model.path=outputs/<run>/final eval.n=16 eval.k=[1,4,16]
  python -m rlpost.eval model.path=Qwen/Qwen2.5-0.5B-Instruct data=files \\
      data.val_files=[val.jsonl] reward=custom reward.fn=my_reward.py:score
Every key, its type and default: python -m rlpost.main --help-keys
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from rlpost.config.schema import ConfigError
    from rlpost.data.rows import DataError
    from rlpost.evaluation.run import compose_eval, evaluate
    from rlpost.rewards.loading import RewardError

    try:
        report = evaluate(compose_eval(argv))
    except (ConfigError, DataError, RewardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.table)
    print(f"wrote {report.output / 'eval.json'} and {report.output / 'eval.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
