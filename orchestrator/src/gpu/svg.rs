//! The picture of a run: GPU memory over time, one panel per GPU, every stage's span shaded
//! and its baseline drawn, so a reader sees at a glance that memory went back to the floor
//! after each stage.

use super::timeline::{Sample, StageSpan};
use super::GpuInfo;
use std::fmt::Write;

const WIDTH: f64 = 1000.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GIB: f64 = (1u64 << 30) as f64;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the SVG document. `duration_s` is the run's length.
pub fn render(
    gpus: &[GpuInfo],
    samples: &[Sample],
    spans: &[StageSpan],
    duration_s: f64,
) -> String {
    let duration = duration_s.max(1e-3);
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = TOP + PANEL_H * gpus.len().max(1) as f64 + 30.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="20" font-size="14" font-weight="bold">GPU memory used (NVML), whole run: shaded = a stage, dashed = its baseline</text>
"##
    );
    if gpus.is_empty() {
        let _ = write!(
            svg,
            r#"<text x="{LEFT}" y="{}">no GPU was checked in this run</text>"#,
            TOP + 20.0
        );
    }
    for (gi, gpu) in gpus.iter().enumerate() {
        let top = TOP + gi as f64 * PANEL_H;
        let plot_h = PANEL_H - 50.0;
        let bottom = top + plot_h;
        let mine: Vec<&Sample> = samples.iter().filter(|s| s.gpu == gi).collect();
        let peak = mine.iter().map(|s| s.used_bytes).max().unwrap_or(0) as f64;
        let y_max = (peak * 1.1).max(GIB);
        let x = |t: f64| LEFT + (t / duration).clamp(0.0, 1.0) * plot_w;
        let y = |b: f64| bottom - (b / y_max).clamp(0.0, 1.0) * plot_h;
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}" font-weight="bold">GPU {} {} ({})</text>"#,
            top + 8.0,
            gpu.index,
            escape(&gpu.name),
            escape(&gpu.uuid)
        );
        // Stage spans and baselines.
        for (k, span) in spans.iter().filter(|s| s.uuid == gpu.uuid).enumerate() {
            let (x0, x1) = (x(span.start_s), x(span.end_s));
            let fill = if !span.clean {
                "#f4b6b6"
            } else if k % 2 == 0 {
                "#dbe8f6"
            } else {
                "#e6f2de"
            };
            let _ = writeln!(
                svg,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{plot_h:.1}" fill="{fill}"><title>{} ({:.2}s–{:.2}s)</title></rect>"#,
                top + 15.0,
                (x1 - x0).max(0.5),
                escape(&span.stage),
                span.start_s,
                span.end_s
            );
            let by = y(span.baseline_bytes as f64);
            let _ = writeln!(
                svg,
                r##"<line x1="{x0:.1}" y1="{by:.1}" x2="{x1:.1}" y2="{by:.1}" stroke="#555" stroke-dasharray="4 3"/>"##
            );
            if x1 - x0 > 30.0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
                    x0 + 3.0,
                    top + 27.0,
                    escape(&span.stage)
                );
            }
        }
        // Memory line, reduced to min/max per pixel column.
        let columns = plot_w as usize;
        let mut lo = vec![f64::INFINITY; columns + 1];
        let mut hi = vec![f64::NEG_INFINITY; columns + 1];
        for s in &mine {
            let c = ((x(s.t_s) - LEFT).round() as usize).min(columns);
            lo[c] = lo[c].min(s.used_bytes as f64);
            hi[c] = hi[c].max(s.used_bytes as f64);
        }
        let mut points = String::new();
        for c in 0..=columns {
            if hi[c].is_finite() {
                let px = LEFT + c as f64;
                let _ = write!(points, "{px:.1},{:.1} ", y(lo[c]));
                if hi[c] > lo[c] {
                    let _ = write!(points, "{px:.1},{:.1} ", y(hi[c]));
                }
            }
        }
        let _ = writeln!(
            svg,
            r##"<polyline points="{}" fill="none" stroke="#1f4e9c" stroke-width="1.5"/>"##,
            points.trim_end()
        );
        // Axes.
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="black"/><line x1="{LEFT}" y1="{:.1}" x2="{LEFT}" y2="{bottom:.1}" stroke="black"/>"##,
            LEFT + plot_w,
            top + 15.0
        );
        for i in 0..=4 {
            let b = y_max * i as f64 / 4.0;
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{:.1} GiB</text>"#,
                LEFT - 4.0,
                y(b) + 4.0,
                b / GIB
            );
        }
        for i in 0..=5 {
            let t = duration * i as f64 / 5.0;
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.1} s</text>"#,
                x(t),
                bottom + 14.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_stage_and_a_line_within_the_panel() {
        let gpus = vec![GpuInfo {
            index: 0,
            cuda_index: 0,
            uuid: "GPU-abc".into(),
            name: "NVIDIA H200".into(),
            total_bytes: 140 << 30,
        }];
        let mib = 1u64 << 20;
        let mut samples = Vec::new();
        for i in 0..300 {
            let t = i as f64 * 0.1;
            let used = if (t as u64) % 10 < 8 {
                8000 * mib
            } else {
                615 * mib
            };
            samples.push(Sample {
                t_s: t,
                gpu: 0,
                used_bytes: used,
            });
        }
        let spans: Vec<StageSpan> = (0..3)
            .map(|k| StageSpan {
                stage: format!("stage-{k}"),
                uuid: "GPU-abc".into(),
                start_s: k as f64 * 10.0,
                end_s: k as f64 * 10.0 + 8.5,
                baseline_bytes: 615 * mib,
                clean: k != 2,
            })
            .collect();
        let svg = render(&gpus, &samples, &spans, 30.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for k in 0..3 {
            assert!(svg.contains(&format!("stage-{k}")));
        }
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            3,
            "one baseline per stage"
        );
        assert!(svg.contains("#f4b6b6"), "the leaking stage is marked");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        let points = svg
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        for p in points.split_whitespace() {
            let (px, py): (f64, f64) = {
                let mut it = p.split(',').map(|v| v.parse::<f64>().unwrap());
                (it.next().unwrap(), it.next().unwrap())
            };
            assert!((LEFT..=WIDTH - RIGHT).contains(&px));
            assert!((TOP..=TOP + PANEL_H).contains(&py));
        }
    }
}
