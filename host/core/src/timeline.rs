//! The pull timeline of a reconcile, as a picture: one lane per pull slot, each pull a bar
//! labelled with its image and bytes, retries and throttle pauses marked, the admission and the
//! concurrency noted. [`Recorder`] turns the executor's events (with their times) into a
//! [`Timeline`]; [`svg`] draws it for anyone to open, [`chrome_trace`] writes the same data in
//! the Chrome trace format (chrome://tracing, Perfetto). Pure: times are given by the caller.

use serde::Serialize;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MarkKind {
    Pull,
    Failed,
    Retry,
    Throttle,
}

/// One bar on a lane, in milliseconds since the reconcile's pulls began.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mark {
    pub kind: MarkKind,
    pub image: String,
    pub start_ms: f64,
    pub end_ms: f64,
    pub bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    pub title: String,
    /// One line each: the admission, the concurrency, the policy.
    pub notes: Vec<String>,
    /// Lane `i` is pull slot `i + 1`, unless `lane_names` names it.
    pub lanes: Vec<Vec<Mark>>,
    /// What each lane is (a node of a simulated rollout); empty: pull slots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lane_names: Vec<String>,
    pub end_ms: f64,
}

impl Timeline {
    /// Lane `i`'s name: `lane_names[i]`, else `slot i + 1`.
    pub fn lane_name(&self, i: usize) -> String {
        self.lane_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("slot {}", i + 1))
    }
}

/// A node's bar on a rollout's timeline, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeBar {
    pub start_ms: u64,
    /// `None`: still at work when the timeline ends.
    pub end_ms: Option<u64>,
    pub failed: bool,
}

impl Timeline {
    /// A rollout's timeline: a lane per node (in the order given), its bar if it has one, red
    /// when it failed, open to `end_ms` while it works.
    pub fn of_nodes(
        title: String,
        notes: Vec<String>,
        nodes: Vec<(String, Option<NodeBar>)>,
        end_ms: u64,
    ) -> Timeline {
        let lanes = nodes
            .iter()
            .map(|(name, bar)| {
                bar.iter()
                    .map(|b| Mark {
                        kind: if b.failed {
                            MarkKind::Failed
                        } else {
                            MarkKind::Pull
                        },
                        image: name.clone(),
                        start_ms: b.start_ms as f64,
                        end_ms: b.end_ms.unwrap_or(end_ms).max(b.start_ms) as f64,
                        bytes: None,
                    })
                    .collect()
            })
            .collect();
        Timeline {
            title,
            notes,
            lanes,
            lane_names: nodes.into_iter().map(|(name, _)| name).collect(),
            end_ms: end_ms as f64,
        }
    }
}

/// Builds a timeline from pull events as they happen.
#[derive(Default)]
pub struct Recorder {
    /// Lane `i`: the marks of pull slot `i`.
    lanes: Vec<Vec<Mark>>,
    /// Image → (its lane, when its pull started).
    running: HashMap<String, (usize, f64)>,
    /// Image → the lane that last pulled it (for the throttle that follows).
    last_lane: HashMap<String, usize>,
    end_ms: f64,
}

impl Recorder {
    /// A pull began on pull slot `slot` (the executor's): its lane. Lanes follow the slots the
    /// executor names, never the events' arrival times, which a busy machine delays.
    pub fn started(&mut self, at_ms: f64, image: &str, slot: usize) {
        if self.lanes.len() <= slot {
            self.lanes.resize_with(slot + 1, Vec::new);
        }
        self.running.insert(image.to_string(), (slot, at_ms));
        self.touch(at_ms);
    }

    /// A try failed; the next in `wait_ms`.
    pub fn retrying(&mut self, at_ms: f64, image: &str, wait_ms: f64) {
        if let Some(&(lane, _)) = self.running.get(image) {
            self.mark(lane, MarkKind::Retry, image, at_ms, at_ms + wait_ms, None);
        }
    }

    /// The pull ended (`ok`: pulled, with its bytes when known).
    pub fn finished(&mut self, at_ms: f64, image: &str, ok: bool, bytes: Option<u64>) {
        if let Some((lane, start)) = self.running.remove(image) {
            let kind = if ok { MarkKind::Pull } else { MarkKind::Failed };
            self.mark(lane, kind, image, start, at_ms, bytes);
            self.last_lane.insert(image.to_string(), lane);
        }
    }

    /// The slot that pulled `image` pauses `pause_ms` (the policy's throttle).
    pub fn throttle(&mut self, at_ms: f64, image: &str, pause_ms: f64) {
        if pause_ms <= 0.0 {
            return;
        }
        if let Some(&lane) = self.last_lane.get(image) {
            self.mark(
                lane,
                MarkKind::Throttle,
                image,
                at_ms,
                at_ms + pause_ms,
                None,
            );
        }
    }

    fn mark(
        &mut self,
        lane: usize,
        kind: MarkKind,
        image: &str,
        start_ms: f64,
        end_ms: f64,
        bytes: Option<u64>,
    ) {
        self.lanes[lane].push(Mark {
            kind,
            image: image.to_string(),
            start_ms,
            end_ms,
            bytes,
        });
        self.touch(end_ms);
    }

    fn touch(&mut self, at_ms: f64) {
        self.end_ms = self.end_ms.max(at_ms);
    }

    pub fn finish(self, title: String, notes: Vec<String>) -> Timeline {
        Timeline {
            title,
            notes,
            lanes: self.lanes,
            lane_names: Vec::new(),
            end_ms: self.end_ms,
        }
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `registry.test/team/app@sha256:…` → `app`.
fn short(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    name.rsplit('/').next().unwrap_or(name)
}

/// Seconds between axis ticks: at most ~10 ticks.
fn tick_step(end_s: f64) -> f64 {
    [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    ]
    .into_iter()
    .find(|s| end_s / s <= 10.0)
    .unwrap_or(7200.0)
}

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 70.0;
const LANE: f64 = 30.0;

/// The timeline as a standalone SVG: one `<g class="lane">` per slot, one `<rect class="pull">`
/// (or `failed`) per pull, `retry` and `throttle` marks, each with a `<title>` tooltip.
pub fn svg(t: &Timeline) -> String {
    let top = 30.0 + 16.0 * t.notes.len() as f64;
    let height = top + LANE * t.lanes.len().max(1) as f64 + 56.0;
    let end = t.end_ms.max(1.0);
    let x = |ms: f64| LEFT + ms / end * (WIDTH - LEFT - 20.0);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        escape(&t.title)
    );
    for (i, note) in t.notes.iter().enumerate() {
        out.push_str(&format!(
            "<text x=\"10\" y=\"{}\">{}</text>\n",
            36.0 + 16.0 * i as f64,
            escape(note)
        ));
    }
    for (i, lane) in t.lanes.iter().enumerate() {
        let y = top + LANE * i as f64;
        let name = t.lane_name(i);
        // About 6 px per character at 11 px: what fits left of the lanes, the rest elided.
        let room = ((LEFT - 14.0) / 6.0) as usize;
        let label: String = if name.chars().count() <= room {
            name.clone()
        } else {
            name.chars().take(room - 1).chain(['…']).collect()
        };
        out.push_str(&format!(
            "<g class=\"lane\" data-slot=\"{}\">\n<text x=\"10\" y=\"{}\">{}<title>{}</title></text>\n",
            i + 1,
            y + 19.0,
            escape(&label),
            escape(&name)
        ));
        for m in lane {
            out.push_str(&mark_svg(m, x(m.start_ms), x(m.end_ms), y));
        }
        out.push_str("</g>\n");
    }
    let bottom = top + LANE * t.lanes.len().max(1) as f64 + 4.0;
    out.push_str(&axis(bottom, end, &x));
    out.push_str(&legend(bottom + 36.0, t));
    out.push_str("</svg>\n");
    out
}

fn mark_svg(m: &Mark, x0: f64, x1: f64, y: f64) -> String {
    let (class, fill, h, dy) = match m.kind {
        MarkKind::Pull => ("pull", "#4e79a7", 22.0, 4.0),
        MarkKind::Failed => ("failed", "#e15759", 22.0, 4.0),
        MarkKind::Retry => ("retry", "#f28e2b", 8.0, 22.0),
        MarkKind::Throttle => ("throttle", "#bab0ac", 10.0, 10.0),
    };
    let w = (x1 - x0).max(1.0);
    let secs = (m.end_ms - m.start_ms) / 1000.0;
    let bytes = m.bytes.map(pinset_policy_sdk::fmt_bytes);
    let what = match m.kind {
        MarkKind::Pull | MarkKind::Failed => format!(
            "{} {}{} in {secs:.2}s",
            if m.kind == MarkKind::Pull {
                "pulled"
            } else {
                "FAILED"
            },
            m.image,
            bytes
                .as_ref()
                .map(|b| format!(" ({b})"))
                .unwrap_or_default()
        ),
        MarkKind::Retry => format!("retry of {} in {secs:.2}s", m.image),
        MarkKind::Throttle => format!("throttle {secs:.2}s after {}", m.image),
    };
    let mut out = format!(
        "<rect class=\"{class}\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{h}\" fill=\"{fill}\"><title>{}</title></rect>\n",
        y + dy,
        escape(&what)
    );
    if matches!(m.kind, MarkKind::Pull | MarkKind::Failed) && w > 50.0 {
        // About 6 px per character at 11 px: the name and bytes, else the name, else its start.
        let room = ((w - 6.0) / 6.0) as usize;
        let name = short(&m.image);
        let fit = match &bytes {
            Some(b) if name.chars().count() + 1 + b.chars().count() <= room => {
                format!("{name} {b}")
            }
            _ if name.chars().count() <= room => name.to_string(),
            _ => name
                .chars()
                .take(room.saturating_sub(1))
                .chain(['…'])
                .collect(),
        };
        out.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"white\">{}</text>\n",
            x0 + 3.0,
            y + 19.0,
            escape(&fit)
        ));
    }
    out
}

/// The legend of the kinds of marks `t` holds (a pull always).
fn legend(y: f64, t: &Timeline) -> String {
    let holds = |kind: MarkKind| t.lanes.iter().flatten().any(|m| m.kind == kind);
    let items: Vec<(&str, &str)> = [
        (MarkKind::Pull, "#4e79a7", "pull"),
        (MarkKind::Failed, "#e15759", "failed"),
        (MarkKind::Retry, "#f28e2b", "retry wait"),
        (MarkKind::Throttle, "#bab0ac", "throttle pause"),
    ]
    .into_iter()
    .filter(|&(kind, _, _)| kind == MarkKind::Pull || holds(kind))
    .map(|(_, fill, what)| (fill, what))
    .collect();
    let mut out = String::from("<g class=\"legend\">");
    for (i, (fill, what)) in items.iter().enumerate() {
        let x = WIDTH - 420.0 + 105.0 * i as f64;
        out.push_str(&format!(
            "<rect x=\"{x}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{fill}\"/><text x=\"{}\" y=\"{y:.1}\">{what}</text>",
            y - 9.0,
            x + 14.0
        ));
    }
    out.push_str("</g>\n");
    out
}

fn axis(y: f64, end_ms: f64, x: &dyn Fn(f64) -> f64) -> String {
    let step = tick_step(end_ms / 1000.0);
    let mut out = format!(
        "<line x1=\"{LEFT}\" y1=\"{y}\" x2=\"{:.1}\" y2=\"{y}\" stroke=\"black\"/>\n",
        x(end_ms)
    );
    let mut s = 0.0;
    while s * 1000.0 <= end_ms + 1e-6 {
        let tx = x(s * 1000.0);
        out.push_str(&format!(
            "<line x1=\"{tx:.1}\" y1=\"{y}\" x2=\"{tx:.1}\" y2=\"{:.1}\" stroke=\"black\"/><text x=\"{tx:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{s}s</text>\n",
            y + 4.0,
            y + 16.0
        ));
        s += step;
    }
    out
}

/// The same marks in the Chrome trace event format (complete events, microseconds; one
/// thread per slot).
pub fn chrome_trace(t: &Timeline) -> serde_json::Value {
    let mut events = vec![serde_json::json!({
        "name": "process_name", "ph": "M", "pid": 1, "args": {"name": t.title}
    })];
    for (i, lane) in t.lanes.iter().enumerate() {
        events.push(serde_json::json!({
            "name": "thread_name", "ph": "M", "pid": 1, "tid": i + 1, "args": {"name": t.lane_name(i)}
        }));
        for m in lane {
            events.push(serde_json::json!({
                "name": format!("{:?} {}", m.kind, short(&m.image)).to_lowercase(),
                "cat": m.kind,
                "ph": "X",
                "pid": 1,
                "tid": i + 1,
                "ts": (m.start_ms * 1000.0).round(),
                "dur": ((m.end_ms - m.start_ms) * 1000.0).round(),
                "args": {"image": m.image, "bytes": m.bytes},
            }));
        }
    }
    serde_json::json!({"traceEvents": events, "otherData": {"notes": t.notes}})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two slots, three pulls, a retry and throttles, as the executor reports them.
    fn sample() -> Timeline {
        let mut r = Recorder::default();
        r.started(0.0, "q.io/a@sha256:1", 0);
        r.started(0.0, "q.io/b@sha256:2", 1);
        r.retrying(100.0, "q.io/b@sha256:2", 1000.0);
        r.finished(500.0, "q.io/a@sha256:1", true, Some(1 << 20));
        r.throttle(500.0, "q.io/a@sha256:1", 1000.0);
        r.started(1500.0, "q.io/c@sha256:3", 0);
        r.finished(1600.0, "q.io/b@sha256:2", false, None);
        r.finished(2000.0, "q.io/c@sha256:3", true, None);
        r.finish("node n".into(), vec!["admission: admit-all".into()])
    }

    #[test]
    fn pulls_keep_their_slot_and_a_throttle_holds_it() {
        let t = sample();
        assert_eq!(t.lanes.len(), 2, "{t:?}");
        let kinds = |lane: &[Mark]| {
            lane.iter()
                .map(|m| (m.kind, short(&m.image).to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            kinds(&t.lanes[0]),
            [
                (MarkKind::Pull, "a".into()),
                (MarkKind::Throttle, "a".into()),
                (MarkKind::Pull, "c".into())
            ]
        );
        assert_eq!(
            kinds(&t.lanes[1]),
            [
                (MarkKind::Retry, "b".into()),
                (MarkKind::Failed, "b".into())
            ]
        );
        assert_eq!(t.end_ms, 2000.0);
    }

    #[test]
    fn the_svg_has_a_lane_per_slot_and_a_bar_per_pull() {
        let svg = svg(&sample());
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert_eq!(svg.matches("<g class=\"lane\"").count(), 2);
        assert_eq!(
            svg.matches("class=\"pull\"").count() + svg.matches("class=\"failed\"").count(),
            3
        );
        assert_eq!(svg.matches("class=\"throttle\"").count(), 1);
        assert_eq!(svg.matches("class=\"retry\"").count(), 1);
        assert!(svg.contains("pulled q.io/a@sha256:1 (1.0 MiB)"), "{svg}");
        assert!(!svg.contains("<script"), "escaped text only");
        assert!(svg.contains(">slot 2<title>slot 2</title>"), "{svg}");
        for item in ["pull", "failed", "retry wait", "throttle pause"] {
            assert!(
                svg.contains(&format!(">{item}</text>")),
                "legend {item}: {svg}"
            );
        }
    }

    #[test]
    fn the_chrome_trace_holds_the_same_marks() {
        let trace = chrome_trace(&sample());
        let complete: Vec<&serde_json::Value> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        assert_eq!(complete.len(), 5);
        assert!(
            complete
                .iter()
                .any(|e| e["cat"] == "throttle" && e["dur"] == 1_000_000.0)
        );
    }

    #[test]
    fn text_from_images_is_escaped() {
        let mut r = Recorder::default();
        r.started(0.0, "q.io/<script>@sha256:1", 0);
        r.finished(3000.0, "q.io/<script>@sha256:1", true, None);
        let svg = svg(&r.finish("<n>".into(), Vec::new()));
        assert!(
            !svg.contains("<script>") && svg.contains("&lt;script&gt;"),
            "{svg}"
        );
        assert!(
            !svg.contains(">retry wait</text>"),
            "no retry, none in the legend"
        );
    }
}
