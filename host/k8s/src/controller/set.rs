//! A set's reconcile: its status (image count, the pools that select it).

use super::{Context, ControllerError, RESYNC, observed};
use crate::api::{PinnedImageSet, PinnedImageSetStatus};
use crate::convert;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use pinset_core::pool;
use serde_json::json;
use std::sync::Arc;

pub(super) async fn reconcile(
    set: Arc<PinnedImageSet>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    observed(set.as_ref(), &ctx, reconcile_set(&set, &ctx)).await
}

async fn reconcile_set(set: &PinnedImageSet, ctx: &Context) -> Result<Action, ControllerError> {
    ctx.synced().await;
    let name = set.name_any();
    // The pools whose selector selects the set, judged from the pool cache as the pool
    // reconciler judges it (not from the written specs, which may lag).
    let labels = set.labels();
    let selections: Vec<(String, Vec<String>)> = ctx
        .pools
        .state()
        .iter()
        .filter_map(|p| convert::pool(p).ok())
        .filter_map(|p| {
            pool::select_labelled(&p, [(name.as_str(), labels)])
                .ok()
                .flatten()
                .map(|names| (p.name, names))
        })
        .collect();
    let pools = pool::pools_of_set(
        &name,
        selections
            .iter()
            .map(|(p, names)| (p.as_str(), names.as_slice())),
    );
    let status = PinnedImageSetStatus {
        image_count: set.spec.pinned_images.len() as u32,
        pools,
        // Another controller's to write: a merge patch without them leaves them.
        conditions: Vec::new(),
    };
    let written = set.status.as_ref();
    if written.is_some_and(|w| w.image_count == status.image_count && w.pools == status.pools) {
        return Ok(Action::requeue(RESYNC));
    }
    let api: Api<PinnedImageSet> = Api::all(ctx.client.clone());
    api.patch_status(
        &name,
        &PatchParams::default(),
        // The resourceVersion turns a write from a stale cache into a conflict (read again)
        // instead of a repeated write.
        &Patch::Merge(
            &json!({"metadata": {"resourceVersion": set.resource_version()}, "status": status}),
        ),
    )
    .await
    .map_err(|source| ControllerError::SetWrite {
        set: name.clone(),
        source,
    })?;
    ctx.metrics.count_api_write("set_status");
    Ok(Action::requeue(RESYNC))
}
