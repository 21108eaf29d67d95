//! On the node: the sets its grant does not cover wait; what it says of them.

use super::*;

/// On the node: `desired` without the sets its grant does not cover and that miss an image
/// (`present` by index of `desired.images`); those go to `waiting`. Sets whose images are all
/// present stay: they are verified and pinned without a grant. Without a grant field
/// (`desired.grant` is `None`) everything stays.
pub fn gate(desired: &Desired, present: &[bool]) -> Desired {
    let Some(grant) = &desired.grant else {
        return desired.clone();
    };
    let held = |s: &DesiredSet| {
        !grant.covers(&s.name, s.generation)
            && s.images
                .iter()
                .any(|&i| !present.get(i).copied().unwrap_or(false))
    };
    let mut out = Desired {
        pools: desired.pools.clone(),
        invalid: desired.invalid.clone(),
        grant: desired.grant.clone(),
        waiting: desired.waiting.clone(),
        ..Default::default()
    };
    let mut index: HashMap<usize, usize> = HashMap::new();
    for set in &desired.sets {
        if held(set) {
            out.waiting.push((set.name.clone(), set.generation));
            continue;
        }
        let images = set
            .images
            .iter()
            .map(|&i| {
                *index.entry(i).or_insert_with(|| {
                    out.images.push(Wanted {
                        reference: desired.images[i].reference.clone(),
                        sets: Vec::new(),
                    });
                    out.images.len() - 1
                })
            })
            .collect::<Vec<_>>();
        for &i in &images {
            out.images[i].sets.push(set.name.clone());
        }
        out.sets.push(DesiredSet {
            name: set.name.clone(),
            generation: set.generation,
            images,
        });
    }
    out
}

/// The node's Progressing message while sets wait for a grant.
pub fn waiting_message(waiting: &[(String, i64)]) -> String {
    let sets: Vec<String> = waiting
        .iter()
        .map(|(name, generation)| format!("{name} generation {generation}"))
        .collect();
    format!(
        "waiting for a rollout grant from the pool's fleet policy to pull PinnedImageSet(s) {}; \
         images already present are pinned",
        sets.join(", ")
    )
}
