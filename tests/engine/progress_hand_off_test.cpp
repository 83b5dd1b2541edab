// The hand-off model of docs/progress.md ("Who drives progress"), in virtual time: every
// hand-over between the progress thread and application threads, with no threads and no
// sleeps. The progress thread's side is a series of looks at the times its parks end.
#include "engine/progress_hand_off.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace peercm::engine {
namespace {

using namespace std::chrono_literals;
using Decision = ProgressHandOff::Decision;

constexpr Clock::duration kInterval = ProgressHandOff::kLookInterval;
const Clock::time_point t0 = Clock::time_point(1h);

TEST(ProgressHandOff, WithNoApplicationThreadTheProgressThreadDrives) {
  ProgressHandOff hand_off;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(hand_off.look(t0 + i * 1s).decision, Decision::drive);
  EXPECT_EQ(hand_off.parked_looks(), 0u);
  EXPECT_EQ(hand_off.driving_looks(), 3u);
}

TEST(ProgressHandOff, ApplicationProgressParksTheThreadForOneIntervalThenItDrivesAgain) {
  ProgressHandOff hand_off;
  hand_off.note_application_progress();
  const auto look = hand_off.look(t0);
  EXPECT_EQ(look.decision, Decision::park);
  EXPECT_EQ(look.look_again, t0 + kInterval);
  EXPECT_EQ(hand_off.look(look.look_again).decision, Decision::drive) << "nothing since the last look";
}

// A poller polling every 10 us for 100 ms (virtual): the thread never drives, and it looks
// once per interval, not once per pass.
TEST(ProgressHandOff, ABusyPollerKeepsTheThreadParkedAtOneLookPerInterval) {
  ProgressHandOff hand_off;
  Clock::time_point next_look = t0;
  int drives = 0;
  for (Clock::time_point now = t0; now < t0 + 100ms; now += 10us) {
    hand_off.note_application_progress();
    if (now >= next_look) {
      const auto look = hand_off.look(now);
      if (look.decision == Decision::drive) {
        ++drives;
        next_look = now;
      } else {
        next_look = look.look_again;
      }
    }
  }
  EXPECT_EQ(drives, 0);
  EXPECT_EQ(hand_off.parked_looks(), 100u);
}

// The same poller, driving with the owner mutex held, postpones the parked thread's look as
// the reactor does (postpone_look() every kPostponeCheckEvery-th activity): the thread looks
// once in 100 ms, not once per interval, and its timer is moved at most once per half
// interval.
TEST(ProgressHandOff, APollerThatPostponesTheLookKeepsTheThreadAsleep) {
  ProgressHandOff hand_off;
  hand_off.note_application_progress();
  Clock::time_point next_look = hand_off.look(t0).look_again;
  int postpones = 0;
  for (Clock::time_point now = t0; now < t0 + 100ms; now += 10us) {
    if (hand_off.note_application_progress_locked()) {
      if (const auto later = hand_off.postpone_look(now)) {
        EXPECT_EQ(*later, now + kInterval);
        next_look = *later;
        ++postpones;
      }
    }
    if (now >= next_look) next_look = hand_off.look(now).look_again;
  }
  EXPECT_EQ(hand_off.parked_looks(), 1u) << "a look that found the poller is a wake-up";
  EXPECT_EQ(hand_off.driving_looks(), 0u);
  EXPECT_GE(postpones, 100ms / kInterval);
  EXPECT_LE(postpones, 2 * (100ms / kInterval) + 1);
}

TEST(ProgressHandOff, OnlyAParkedThreadsLookIsPostponed) {
  ProgressHandOff hand_off;
  EXPECT_FALSE(hand_off.postpone_look(t0)) << "no look yet";
  EXPECT_EQ(hand_off.look(t0).decision, Decision::drive);
  EXPECT_FALSE(hand_off.postpone_look(t0 + 1s)) << "the thread drives";
  hand_off.note_application_progress();
  ASSERT_EQ(hand_off.look(t0 + 2s).decision, Decision::park);
  EXPECT_FALSE(hand_off.postpone_look(t0 + 2s)) << "a whole interval away";
  EXPECT_EQ(hand_off.postpone_look(t0 + 2s + kInterval / 2), t0 + 2s + kInterval / 2 + kInterval);
}

// A poller that postponed the look and then stops without saying so: the postponed look finds
// its activity and parks once more, the next drives, within two intervals of its last activity.
TEST(ProgressHandOff, AfterPostponedLooksTheThreadStillTakesOverWithinTwoIntervals) {
  for (Clock::duration last = 0us; last < 3 * kInterval; last += 50us) {
    ProgressHandOff hand_off;
    hand_off.note_application_progress();
    Clock::time_point look_at = hand_off.look(t0).look_again;
    Clock::time_point drove_at{};
    for (Clock::time_point now = t0; drove_at == Clock::time_point{}; now += 10us) {
      if (now <= t0 + last && hand_off.note_application_progress_locked()) {
        if (const auto later = hand_off.postpone_look(now)) look_at = *later;
      }
      if (now < look_at) continue;
      const auto look = hand_off.look(now);
      if (look.decision == Decision::drive) {
        drove_at = now;
      } else {
        look_at = look.look_again;
      }
    }
    EXPECT_GT(drove_at, t0 + last);
    EXPECT_LE(drove_at - (t0 + last), 2 * kInterval) << "last activity at +" << last.count() << " ns";
  }
}

// An application that stops polling without saying so (it goes off to compute): the thread
// drives within two intervals of the last activity, wherever that falls between two looks.
TEST(ProgressHandOff, TheThreadTakesOverWithinTwoIntervalsOfTheLastActivity) {
  for (Clock::duration last = 0us; last < 3 * kInterval; last += 50us) {
    ProgressHandOff hand_off;
    Clock::time_point look_at = t0;
    Clock::time_point drove_at{};
    Clock::time_point activity = t0;
    while (drove_at == Clock::time_point{}) {
      // Everything the application did up to this look: a pass every 10 us until `last`.
      for (; activity <= t0 + last && activity <= look_at; activity += 10us) hand_off.note_application_progress();
      const auto look = hand_off.look(look_at);
      if (look.decision == Decision::drive && look_at > t0 + last) {
        drove_at = look_at;
      } else {
        look_at = look.decision == Decision::park ? look.look_again : look_at + 10us;
      }
    }
    EXPECT_LE(drove_at - (t0 + last), 2 * kInterval) << "last activity at +" << last.count() << " ns";
  }
}

// CompletionChannel::get_event: an application thread asleep on the reactor makes no activity
// while it sleeps, and the thread stays parked however long the sleep.
TEST(ProgressHandOff, ABlockingWaiterKeepsTheThreadParkedThroughoutItsSleep) {
  ProgressHandOff hand_off;
  hand_off.begin_blocking_wait();
  Clock::time_point now = t0;
  for (int i = 0; i < 1000; ++i) {
    const auto look = hand_off.look(now);
    ASSERT_EQ(look.decision, Decision::park) << "look " << i;
    now = look.look_again;
  }
  hand_off.end_blocking_wait();
  // The wait's end counts as activity: a waiter that goes straight back to polling keeps the
  // reactor; one that leaves gives it up an interval later.
  const auto look = hand_off.look(now);
  EXPECT_EQ(look.decision, Decision::park);
  EXPECT_EQ(hand_off.look(look.look_again).decision, Decision::drive);
}

TEST(ProgressHandOff, TwoBlockingWaitersKeepTheThreadParkedUntilBothEnd) {
  ProgressHandOff hand_off;
  hand_off.begin_blocking_wait();
  hand_off.begin_blocking_wait();
  hand_off.end_blocking_wait();
  auto look = hand_off.look(t0);
  look = hand_off.look(look.look_again);
  EXPECT_EQ(look.decision, Decision::park) << "one waiter still sleeps";
  hand_off.end_blocking_wait();
  look = hand_off.look(look.look_again);
  look = hand_off.look(look.look_again);
  EXPECT_EQ(look.decision, Decision::drive);
}

// An application thread about to sleep where the reactor cannot see it (its own poll() on a
// channel fd while the reactor was taken) hands back: the next look drives, whatever the
// activity before, and a park in progress ends at once.
TEST(ProgressHandOff, AHandBackDrivesAtTheNextLookDespiteActivity) {
  ProgressHandOff hand_off;
  hand_off.note_application_progress();
  const auto parked = hand_off.look(t0);
  ASSERT_EQ(parked.decision, Decision::park);
  EXPECT_FALSE(hand_off.handed_back_since_look());
  hand_off.note_application_progress();
  hand_off.hand_back();
  EXPECT_TRUE(hand_off.handed_back_since_look()) << "the parked thread's wait ends on it";
  EXPECT_EQ(hand_off.look(t0 + 1us).decision, Decision::drive);
  EXPECT_FALSE(hand_off.handed_back_since_look());
  // Activity after the hand-back parks the thread again: the application is back.
  hand_off.note_application_progress();
  EXPECT_EQ(hand_off.look(t0 + 2us).decision, Decision::park);
}

TEST(ProgressHandOff, AHandBackDoesNotOverrideAnotherThreadsBlockingWait) {
  ProgressHandOff hand_off;
  hand_off.begin_blocking_wait();
  hand_off.hand_back();
  EXPECT_EQ(hand_off.look(t0).decision, Decision::park);
}

}  // namespace
}  // namespace peercm::engine
