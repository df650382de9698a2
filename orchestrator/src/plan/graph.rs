//! The stage graph: edges from each stage to the stages it runs after.
//!
//! Everything here is iterative, so a plan of tens of thousands of stages in one long chain
//! does not exhaust the stack.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A topological order of the stages (every stage after all of its upstreams), preferring the
/// earlier stage of the plan whenever several are ready; `None` if there is a cycle.
pub(crate) fn topological_order(upstream: &[Vec<usize>]) -> Option<Vec<usize>> {
    let n = upstream.len();
    let mut waiting: Vec<usize> = upstream.iter().map(Vec::len).collect();
    let downstream = invert(upstream);
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| waiting[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(stage)) = ready.pop() {
        order.push(stage);
        for &next in &downstream[stage] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push(Reverse(next));
            }
        }
    }
    (order.len() == n).then_some(order)
}

/// For each stage, the stages that list it as upstream, in increasing order.
pub(crate) fn invert(upstream: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut downstream = vec![Vec::new(); upstream.len()];
    for (stage, ups) in upstream.iter().enumerate() {
        for &up in ups {
            downstream[up].push(stage);
        }
    }
    downstream
}

/// One cycle per group of stages that wait on each other, written in the direction the work
/// would flow: `[a, b, c]` means `b` runs after `a`, `c` after `b` and `a` after `c`.
///
/// Each cycle starts at its lowest stage index; cycles come in order of that index. Stages
/// that list themselves are not reported here (that is a plainer mistake, checked apart).
pub(crate) fn find_cycles(upstream: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let downstream = invert(upstream);
    let components = strongly_connected(&downstream);
    let mut cycles: Vec<Vec<usize>> = components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|component| cycle_within(&downstream, &component))
        .collect();
    cycles.sort_by_key(|c| c[0]);
    cycles
}

/// A simple cycle through the lowest stage of a strongly connected `component`, following
/// `edges` (breadth first, so the cycle is a shortest one through that stage).
fn cycle_within(edges: &[Vec<usize>], component: &[usize]) -> Vec<usize> {
    let start = *component.iter().min().unwrap_or(&0);
    let mut inside = vec![false; edges.len()];
    for &c in component {
        inside[c] = true;
    }
    let mut came_from: Vec<Option<usize>> = vec![None; edges.len()];
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(stage) = queue.pop_front() {
        for &next in &edges[stage] {
            if !inside[next] || next == stage {
                continue;
            }
            if next == start {
                let mut cycle = vec![stage];
                let mut at = stage;
                while let Some(prev) = came_from[at] {
                    cycle.push(prev);
                    at = prev;
                }
                if at != start {
                    cycle.push(start);
                }
                cycle.reverse();
                return cycle;
            }
            if came_from[next].is_none() && next != start {
                came_from[next] = Some(stage);
                queue.push_back(next);
            }
        }
    }
    vec![start]
}

/// Tarjan's strongly connected components, without recursion.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0;
    // Each frame: a stage and how many of its edges were followed.
    let mut frames: Vec<(usize, usize)> = Vec::new();
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        frames.push((root, 0));
        while let Some(&mut (v, ref mut followed)) = frames.last_mut() {
            if *followed == 0 && index[v] == UNSEEN {
                index[v] = next_index;
                low[v] = next_index;
                next_index += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = edges[v].get(*followed) {
                *followed += 1;
                if index[w] == UNSEEN {
                    frames.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// Whether `ancestor` is upstream of `stage`, directly or through other stages.
pub(crate) fn is_upstream(upstream: &[Vec<usize>], ancestor: usize, stage: usize) -> bool {
    if upstream
        .get(stage)
        .is_some_and(|ups| ups.contains(&ancestor))
    {
        return true;
    }
    let mut seen = vec![false; upstream.len()];
    let mut todo = vec![stage];
    while let Some(s) = todo.pop() {
        for &up in &upstream[s] {
            if up == ancestor {
                return true;
            }
            if !seen[up] {
                seen[up] = true;
                todo.push(up);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_a_diamond_stably() {
        // 0 → {1, 2} → 3, written as upstream lists.
        let upstream = vec![vec![], vec![0], vec![0], vec![2, 1]];
        assert_eq!(topological_order(&upstream), Some(vec![0, 1, 2, 3]));
        let upstream = vec![vec![3], vec![], vec![1], vec![2]];
        assert_eq!(topological_order(&upstream), Some(vec![1, 2, 3, 0]));
    }

    #[test]
    fn finds_no_cycle_in_a_dag() {
        let upstream = vec![vec![], vec![0], vec![0, 1], vec![2]];
        assert!(find_cycles(&upstream).is_empty());
        assert!(topological_order(&upstream).is_some());
    }

    #[test]
    fn names_a_three_cycle_in_flow_order() {
        // b after a, c after b, a after c.
        let upstream = vec![vec![2], vec![0], vec![1], vec![]];
        assert_eq!(find_cycles(&upstream), vec![vec![0, 1, 2]]);
        assert_eq!(topological_order(&upstream), None);
    }

    #[test]
    fn finds_each_separate_cycle_and_a_two_cycle() {
        // {0,1} wait on each other; {2,3,4} form a cycle; 5 hangs below the second.
        let upstream = vec![vec![1], vec![0], vec![4], vec![2], vec![3], vec![4]];
        assert_eq!(find_cycles(&upstream), vec![vec![0, 1], vec![2, 3, 4]]);
    }

    #[test]
    fn a_cycle_within_a_larger_tangle_is_simple() {
        // 0 → 1 → 2 → 0 and 1 → 3 → 0: one component, shortest cycle through 0.
        let upstream = vec![vec![2, 3], vec![0], vec![1], vec![1]];
        let cycles = find_cycles(&upstream);
        assert_eq!(cycles.len(), 1);
        let cycle = &cycles[0];
        assert_eq!(cycle[0], 0);
        assert_eq!(cycle.len(), 3);
        for (i, &stage) in cycle.iter().enumerate() {
            let next = cycle[(i + 1) % cycle.len()];
            assert!(upstream[next].contains(&stage), "{cycle:?}");
        }
    }

    #[test]
    fn self_loops_are_left_to_their_own_check() {
        assert!(find_cycles(&[vec![0]]).is_empty());
    }

    #[test]
    fn long_chains_do_not_overflow() {
        let n = 100_000;
        let mut upstream: Vec<Vec<usize>> = (0..n)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(topological_order(&upstream).map(|o| o.len()), Some(n));
        assert!(find_cycles(&upstream).is_empty());
        assert!(is_upstream(&upstream, 0, n - 1));
        upstream[0].push(n - 1);
        assert_eq!(find_cycles(&upstream).len(), 1);
        assert_eq!(find_cycles(&upstream)[0].len(), n);
    }

    #[test]
    fn upstream_is_transitive() {
        let upstream = vec![vec![], vec![0], vec![1], vec![]];
        assert!(is_upstream(&upstream, 0, 2));
        assert!(is_upstream(&upstream, 1, 2));
        assert!(!is_upstream(&upstream, 2, 0));
        assert!(!is_upstream(&upstream, 3, 2));
        assert!(!is_upstream(&upstream, 2, 2));
    }
}
