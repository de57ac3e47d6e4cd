//! A list with at least one element: the deliveries one attempt sends.

/// At least one `T`: the first, then any others.
pub(in crate::worker) struct NonEmpty<T> {
    first: T,
    rest: Vec<T>,
}

impl<T> NonEmpty<T> {
    /// A list of just `first`.
    pub(in crate::worker) fn one(first: T) -> NonEmpty<T> {
        NonEmpty { first, rest: Vec::new() }
    }

    /// Adds `t` at the end.
    pub(in crate::worker) fn push(&mut self, t: T) {
        self.rest.push(t);
    }

    /// How many elements it holds (at least one).
    pub(in crate::worker) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// The first element (the list's only one, or the head of a longer list).
    pub(in crate::worker) fn first(&self) -> &T {
        &self.first
    }

    /// The elements in order.
    pub(in crate::worker) fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.first).chain(&self.rest)
    }
}

impl<T> IntoIterator for NonEmpty<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::iter::Once<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self.first).chain(self.rest)
    }
}
