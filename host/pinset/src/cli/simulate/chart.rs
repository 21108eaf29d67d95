//! The simulated rollout in a terminal: a row per node across the run's time (waiting, pulling,
//! failed), and the decisions that granted nodes.

use super::human;
use pinset_core::rollout_sim::{NodeRun, Run};

/// Columns of the time axis.
const WIDTH: usize = 60;
/// Rows shown before the middle of a large pool is left out.
const MAX_ROWS: usize = 100;
/// Granting decisions listed before the rest is counted.
const MAX_DECISIONS: usize = 20;

/// The chart: `·` waiting for a grant, `█` pulling, `▒` the pull that failed, `x` failed and
/// retrying (holding its slot), blank at the target.
pub fn print(run: &Run) {
    let end = run.end_ms.max(1);
    let name_width = run.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4);
    println!("{:name_width$}  {}", "", axis(end));
    let rows = &run.nodes;
    let shown: Vec<usize> = if rows.len() <= MAX_ROWS {
        (0..rows.len()).collect()
    } else {
        (0..MAX_ROWS / 2)
            .chain(rows.len() - MAX_ROWS / 2..rows.len())
            .collect()
    };
    for (k, &i) in shown.iter().enumerate() {
        if k > 0 && i != shown[k - 1] + 1 {
            println!(
                "{:name_width$}  … {} more node(s) …",
                "",
                i - shown[k - 1] - 1
            );
        }
        let node = &rows[i];
        println!(
            "{:name_width$}  {}  {}",
            node.name,
            row(node, end),
            outcome(node)
        );
    }
    println!(
        "{:name_width$}  · waiting   █ pulling   ▒ pull failed   x failed, retrying",
        ""
    );
}

/// Tick labels at the start, the quarters and the end of the run.
fn axis(end: u64) -> String {
    let mut line = vec![' '; WIDTH + 8];
    for q in 0..=4 {
        let label = human(end * q / 4);
        let at = (WIDTH * q as usize / 4).min(WIDTH + 8 - label.len());
        for (j, c) in label.chars().enumerate() {
            line[at + j] = c;
        }
    }
    line.into_iter().collect::<String>().trim_end().to_string()
}

fn row(node: &NodeRun, end: u64) -> String {
    (0..WIDTH)
        .map(|c| {
            // The middle of column `c`.
            let t = (2 * c as u64 + 1) * end / (2 * WIDTH as u64);
            let Some(start) = node.granted_ms.filter(|&s| s <= t) else {
                return '·';
            };
            let failed = node.outcome == "failed";
            match node.ended_ms {
                Some(e) if t >= e && failed => 'x',
                Some(e) if t >= e => ' ',
                _ if failed => '▒',
                _ if t >= start => '█',
                _ => '·',
            }
        })
        .collect()
}

fn outcome(node: &NodeRun) -> String {
    match (node.outcome, node.ended_ms) {
        ("done", Some(e)) => format!("done at {}", human(e)),
        ("failed", Some(e)) => format!("failed at {}", human(e)),
        ("pulling", _) => "granted, never finished (not Ready)".into(),
        _ => "never granted".into(),
    }
}

/// The decisions that granted nodes (the first [`MAX_DECISIONS`]), and the last one's reason.
pub fn print_decisions(run: &Run) {
    let granting: Vec<_> = run
        .decisions
        .iter()
        .filter(|d| !d.granted.is_empty())
        .collect();
    println!("decisions that granted nodes ({}):", granting.len());
    let listed = &granting[..granting.len().min(MAX_DECISIONS)];
    let width = listed
        .iter()
        .map(|d| names(&d.granted).chars().count())
        .max()
        .unwrap_or(0);
    for d in listed {
        println!(
            "  {:>7}  {:<width$}  {}{}",
            human(d.at_ms),
            names(&d.granted),
            d.reason,
            if d.fallback { "  [fallback]" } else { "" }
        );
    }
    if granting.len() > MAX_DECISIONS {
        println!(
            "  … {} more (-o json lists every decision)",
            granting.len() - MAX_DECISIONS
        );
    }
    if let Some(last) = run.decisions.last() {
        println!("  last decision, at {}: {}", human(last.at_ms), last.reason);
    }
}

/// `a, b, c` or `a, b, … (+5)`.
fn names(granted: &[String]) -> String {
    if granted.len() <= 3 {
        return granted.join(", ");
    }
    format!("{}, {}, … (+{})", granted[0], granted[1], granted.len() - 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(granted: Option<u64>, ended: Option<u64>, outcome: &'static str) -> NodeRun {
        NodeRun {
            name: "w-00".into(),
            granted_ms: granted,
            ended_ms: ended,
            outcome,
        }
    }

    #[test]
    fn a_row_shows_waiting_pulling_and_failure_in_time() {
        let end = 6000;
        let done = row(&node(Some(1000), Some(3000), "done"), end);
        assert_eq!(done.chars().count(), WIDTH);
        assert!(
            done.starts_with("··········████████████████████ "),
            "{done}"
        );
        assert!(done.ends_with(' '));
        let failed = row(&node(Some(0), Some(3000), "failed"), end);
        assert!(failed.starts_with('▒') && failed.ends_with('x'), "{failed}");
        let waiting = row(&node(None, None, "waiting"), end);
        assert!(waiting.chars().all(|c| c == '·'));
    }

    #[test]
    fn the_axis_labels_start_quarters_and_end() {
        let a = axis(240_000);
        assert!(a.starts_with("0s "), "{a}");
        assert!(
            a.contains("1m00s") && a.contains("2m00s") && a.ends_with("4m00s"),
            "{a}"
        );
    }

    #[test]
    fn long_grants_are_shortened() {
        let many: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        assert_eq!(names(&many), "n0, n1, … (+4)");
        assert_eq!(names(&many[..2]), "n0, n1");
    }
}
