"""How an uneven batch sampler hears of epochs, and defers one move after a resume.

Lightning moves the sampler to each epoch (``set_epoch`` through
``loader.batch_sampler.sampler``) and counts the epoch's batches once, at the start of the
fit; the strategy listens to each move to tell Lightning the epoch's own count
(:meth:`EpochHandoff.on_epoch_set`). A checkpoint taken at an epoch's end needs more: the
restored epoch stays counted as Lightning counted it until Lightning has judged it over
(the move past it is not told, its length is due at the next epoch's first batch), a
DataLoader with workers may begin the next epoch before Lightning moves there (the move is
made early, and undone if Lightning stays in the restored epoch), and a loader rebuilt in
between carries the restored epoch over. :class:`EpochHandoff` holds that bookkeeping for
:class:`~lightning_rex.data.sampler.UnevenBatchSampler`, which cuts the batches.
"""

from __future__ import annotations

from collections.abc import Callable

from lightning_rex.data.permutation import EpochPermutation

__all__ = ["EpochHandoff"]


class EpochHandoff:
    """The epoch position of an uneven batch sampler, and its handoffs with Lightning.

    The sampler draws each epoch's permutation from :attr:`sampler` and calls
    :meth:`_init_epoch_state` in its constructor.
    """

    sampler: EpochPermutation

    def _init_epoch_state(self) -> None:
        self._epoch_start_step = 0
        self._next_epoch_start_step = 0
        self._fetched = 0
        self._resume_at: int | None = None
        # (epoch, batches) of an epoch restored as finished: until the epoch moves on, the
        # loader reports that many batches and yields none, so a checkpoint taken at an
        # epoch's end on another world size does not start the epoch over
        self._finished: tuple[int, int] | None = None
        # Where this epoch's batch grid starts: batch ``origin_batch`` begins at sample
        # ``origin_sample`` of the permutation. (0, 0) except in an epoch resumed from a
        # checkpoint made with another global batch (another world size).
        self._origin_batch = 0
        self._origin_sample = 0
        # the epoch whose iteration has begun (its grid is the one in use)
        self._iter_epoch: int | None = None
        # who hears of a move to another epoch (on_epoch_set); after an epoch restored as
        # finished, the epoch Lightning moves to next, and whether its length is still due
        self._listener: Callable[[int], None] | None = None
        self._await_move: int | None = None
        self._length_due = False
        # a restored epoch that is over, as (epoch, batches counted, batches fetched, its
        # first step, the next's), while an iteration begun in it serves the next epoch
        self._quiet: tuple[int, int, int, int, int] | None = None

    @property
    def epoch(self) -> int:
        """The epoch whose permutation is used."""
        return int(self.sampler.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation (Lightning calls this through ``.sampler``).

        Args:
            epoch: The epoch number.
        """
        self.sampler.set_epoch(epoch)

    def on_epoch_set(self, listener: Callable[[int], None] | None) -> None:
        """Call ``listener(epoch)`` whenever the permutation moves to an epoch.

        Lightning counts an epoch's batches once, when a fit starts; the strategy listens
        here to tell it every epoch's own count (an epoch resumed on another world size,
        or under another global batch, has another length than the epochs after it).

        A listener means Lightning's fit loop drives this sampler. After a checkpoint
        restored an epoch as finished, Lightning's move to the next epoch is not told:
        Lightning, resuming, compares the restored epoch's batches with its count of the
        epoch *after* moving the sampler on (it starts the new epoch afresh only if they
        match). :meth:`take_length_due` says when the count is due instead (the strategy
        asks at the epoch's first batch).

        Args:
            listener: The function, or None to stop listening.
        """
        self._listener = listener
        self.sampler.on_set_epoch = None if listener is None else self._epoch_moved

    def _epoch_moved(self, epoch: int) -> None:
        if self._quiet is not None and epoch == self._quiet[0]:
            # Lightning goes on in the restored epoch (to validate at its end, say): the
            # iteration begun early is not its next epoch's, and the restored epoch stands
            self._undo_quiet_move()
        if self._await_move is not None and epoch == self._await_move:
            self._await_move, self._length_due, self._quiet = None, True, None
        elif self._listener is not None:
            self._listener(epoch)

    def _undo_quiet_move(self) -> None:
        assert self._quiet is not None
        epoch, counted, fetched, start, following = self._quiet
        self.sampler.set_epoch(epoch, notify=False)
        self._quiet, self._iter_epoch = None, None
        self._finished, self._fetched = (epoch, counted), fetched
        self._epoch_start_step, self._next_epoch_start_step = start, following
        self._origin_batch = self._origin_sample = 0

    def carry_restored_epoch(self, previous: EpochHandoff) -> None:
        """Take over an epoch restored as over from the sampler this one replaces.

        Lightning rebuilds the train loader at an epoch's start
        (``reload_dataloaders_every_n_epochs``), after a resume but before it moves past the
        restored epoch; the new sampler must count that epoch as the old one did (Lightning
        judges it over by that count) and begin the next epoch where it would have.

        Args:
            previous: The sampler of the loader rebuilt.
        """
        if previous._await_move is None:
            return
        if previous._quiet is not None:
            previous._undo_quiet_move()
        self.sampler.set_epoch(previous.epoch, notify=False)
        self._finished, self._fetched = previous._finished, previous._fetched
        self._epoch_start_step = previous._epoch_start_step
        self._next_epoch_start_step = previous._next_epoch_start_step
        self._await_move = previous._await_move

    @property
    def awaiting_move(self) -> bool:
        """Whether Lightning has still to move the sampler past an epoch restored as over.

        Until then Lightning counts that epoch's batches, while the sampler may already
        serve the next (a DataLoader with workers begins early, see :meth:`__iter__`).
        """
        return self._await_move is not None

    @property
    def serves_next_epoch(self) -> bool:
        """Whether an iteration begun in a restored epoch that is over serves the next one.

        Until Lightning moves the sampler past it, Lightning still counts the restored
        epoch's batches, and this sampler's length is the next epoch's.
        """
        return self._quiet is not None

    def take_length_due(self) -> bool:
        """Whether the epoch's length is still to be told (once: the answer clears it).

        True after Lightning moved the sampler past an epoch a checkpoint restored as
        finished (see :meth:`on_epoch_set`).

        Returns:
            True once, when the listener should be told of the epoch now.
        """
        due, self._length_due = self._length_due, False
        return due
