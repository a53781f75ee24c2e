"""What the bench scripts read from pipeflow train's metrics.jsonl (imported
by their summaries, run from the repository root)."""
import json
import statistics


def rows(out, name):
    """Every step's metrics line of the run in OUT/NAME."""
    return [json.loads(line) for line in open(f"{out}/{name}/metrics.jsonl")]


def spread(values, fmt="{:.1f}"):
    """min / median / max of VALUES, each formatted with FMT."""
    return ("min " + fmt.format(min(values)) + " / median " + fmt.format(statistics.median(values)) +
            " / max " + fmt.format(max(values)))
