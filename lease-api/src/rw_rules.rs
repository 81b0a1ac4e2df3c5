//! The rules of a read/write lease (C19) as pure functions over one key's
//! holders: the in-memory provider runs them under its lock, every other
//! backend's script or statement states them, and the model checker (the
//! `lease-model` crate) explores them. Each takes the expiries of the live
//! holders and records only (expired ones are dropped first).

/// Until when a new reader is refused: while a writer holds the key, or
/// while a waiting writer's record keeps readers out (so readers arriving
/// one after another cannot starve a writer); `None`: granted.
pub fn read_refused_until<T: Ord + Copy>(
    writer: Option<T>,
    waiting_writers: impl IntoIterator<Item = T>,
) -> Option<T> {
    writer.or_else(|| waiting_writers.into_iter().min())
}

/// Until when a writer is refused: while anyone (the writer or any reader)
/// holds the key, until the last of them expires; `None`: granted.
pub fn write_refused_until<T: Ord + Copy>(holders: impl IntoIterator<Item = T>) -> Option<T> {
    holders.into_iter().max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_writer_keeps_readers_out_and_readers_keep_the_writer_out() {
        assert_eq!(read_refused_until(None::<u8>, []), None);
        assert_eq!(read_refused_until(Some(5u8), [3]), Some(5));
        assert_eq!(read_refused_until(None, [7u8, 3]), Some(3));
        assert_eq!(write_refused_until([2u8, 9, 4]), Some(9));
        assert_eq!(write_refused_until::<u8>([]), None);
    }
}
