//! Coordination recipes built on the lease contract, so every backend runs
//! them: leader election (etcd's Campaign/Observe/Resign and client-go's
//! callback runner) and a counting semaphore of fenced permits. Fair FIFO
//! waiting is an option of [`acquire`](crate::acquire)
//! ([`AcquireOptions::fair`](crate::AcquireOptions::fair)).

pub use crate::election::{Callbacks, Election, Leader, Leadership};
pub use crate::semaphore::{MAX_PERMITS, Permit, Semaphore};
