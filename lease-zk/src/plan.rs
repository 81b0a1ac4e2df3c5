//! What each of the provider's multis checks and changes, as data: the
//! provider writes these steps into ZooKeeper's multi (`write`), and the
//! model checker (the `lease-model` crate) runs the same steps on its own
//! tree, so the checks it explores are the ones the provider sends.

use zookeeper_client::{CreateOptions, MultiWriter};

/// One step of a multi on a key's nodes: the key node (its version is the
/// epoch), the holder node, and the acting owner's marker beside it. A
/// multi commits every step or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The key node is at this version (the epoch).
    CheckEpoch(i32),
    /// The owner's marker still exists, unchanged.
    CheckMarker,
    /// Delete the marker of the holder judged expired (at version 0): it
    /// must still exist, so the holder node about to be deleted is still
    /// that owner's, not one made after a purge that restarted epochs and
    /// holder versions; and no marker outlives the holder taken over.
    DeleteJudgedMarker,
    /// Delete the holder node (at this version, if given).
    DeleteHolder(Option<i32>),
    /// Create the holder node (the acting owner's).
    CreateHolder,
    /// Create the owner's marker.
    CreateMarker,
    /// Delete the owner's marker.
    DeleteMarker,
    /// Write the holder node's data (at this version, if given): a renewal.
    SetHolder(Option<i32>),
    /// Bump the key node's version: the epoch of a new acquisition.
    BumpEpoch,
}

/// What a takeover judged: the holder node expired at this epoch and
/// holder version, and whether its owner (and so its marker) is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Judged {
    /// The key node's version read with the holder node.
    pub epoch: i32,
    /// The holder node's version.
    pub holder_version: i32,
    /// The holder node named its owner (a node of ours always does).
    pub owner_known: bool,
}

/// An acquire: the holder node and the owner's marker created and the
/// epoch bumped. A takeover of a holder judged expired first checks the
/// epoch (concurrent takeovers are exclusive: a fresh holder node starts at
/// version 0 again, so the holder version alone would let a second
/// contender delete the first one's node) and deletes the judged owner's
/// marker (a purge deletes the key node, so epochs and versions start
/// again: without it, a takeover judged before a purge could delete a
/// holder made after it, at the same epoch and version), then deletes that
/// holder at the version it was judged at.
pub fn claim(take_over: Option<Judged>) -> Vec<Step> {
    let mut steps = Vec::with_capacity(6);
    if let Some(j) = take_over {
        steps.push(Step::CheckEpoch(j.epoch));
        if j.owner_known {
            steps.push(Step::DeleteJudgedMarker);
        }
        steps.push(Step::DeleteHolder(Some(j.holder_version)));
    }
    steps.extend([Step::CreateHolder, Step::CreateMarker, Step::BumpEpoch]);
    steps
}

/// An extend at `epoch`: the one-request fast path (no holder version: the
/// unchanged epoch and the owner's marker prove the holder node is ours,
/// see `issued`), or the checked path at the holder version it read.
pub fn extend(epoch: i32, holder_version: Option<i32>) -> Vec<Step> {
    match holder_version {
        None => vec![
            Step::CheckEpoch(epoch),
            Step::CheckMarker,
            Step::SetHolder(None),
        ],
        Some(v) => vec![Step::CheckEpoch(epoch), Step::SetHolder(Some(v))],
    }
}

/// A release at `epoch`: the fast path deletes the marker with the holder;
/// the checked path deletes the holder at the version it read (its marker
/// goes afterwards, on its own).
pub fn release(epoch: i32, holder_version: Option<i32>) -> Vec<Step> {
    match holder_version {
        None => vec![
            Step::CheckEpoch(epoch),
            Step::DeleteMarker,
            Step::DeleteHolder(None),
        ],
        Some(v) => vec![Step::CheckEpoch(epoch), Step::DeleteHolder(Some(v))],
    }
}

/// The clean-up of an owner's expired holder node, read at `epoch` and
/// `holder_version`, with its marker: the epoch check makes it fail once
/// anyone acquired since (a holder node made by a takeover starts at
/// version 0 again, so the version alone could match it).
pub fn forget(epoch: i32, holder_version: i32) -> Vec<Step> {
    vec![
        Step::CheckEpoch(epoch),
        Step::DeleteHolder(Some(holder_version)),
        Step::DeleteMarker,
    ]
}

/// Where a multi's steps act: the key node, the holder node, the acting
/// owner's marker, the holder node's data, and how nodes are created.
pub(crate) struct Target<'a> {
    pub(crate) key: &'a str,
    pub(crate) holder: &'a str,
    pub(crate) marker: &'a str,
    /// The judged holder's marker, for a takeover.
    pub(crate) judged_marker: Option<&'a str>,
    pub(crate) data: &'a [u8],
    pub(crate) ephemeral: &'a CreateOptions<'a>,
}

/// Writes `steps` into `w`.
pub(crate) fn write(
    w: &mut MultiWriter<'_>,
    steps: &[Step],
    t: &Target<'_>,
) -> Result<(), zookeeper_client::Error> {
    for step in steps {
        match *step {
            Step::CheckEpoch(epoch) => w.add_check_version(t.key, epoch)?,
            Step::CheckMarker => w.add_check_version(t.marker, 0)?,
            Step::DeleteJudgedMarker => match t.judged_marker {
                Some(marker) => w.add_delete(marker, Some(0))?,
                None => {
                    return Err(zookeeper_client::Error::BadArguments(
                        &"a takeover's judged marker without its path",
                    ));
                }
            },
            Step::DeleteHolder(version) => w.add_delete(t.holder, version)?,
            Step::CreateHolder => w.add_create(t.holder, t.data, t.ephemeral)?,
            Step::CreateMarker => w.add_create(t.marker, b"", t.ephemeral)?,
            Step::DeleteMarker => w.add_delete(t.marker, Some(0))?,
            Step::SetHolder(version) => w.add_set_data(t.holder, t.data, version)?,
            Step::BumpEpoch => w.add_set_data(t.key, b"", None)?,
        }
    }
    Ok(())
}
