// Every Communicator operation and dtype, checked against values each rank computes alone.
// Values are small multiples of 1/4 so that bf16 holds them and their sums exactly.
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/local_communicator.h"
#include "core/dtype.h"
#include "tests/common/collective_values.h"
#include "tests/multirank/multirank_test.h"

namespace dcp::testing {
namespace {

template <typename T>
class CommunicatorTypedTest : public MultiRankTest {};
using ElementTypes = ::testing::Types<float, bf16, int32_t>;
TYPED_TEST_SUITE(CommunicatorTypedTest, ElementTypes);

TYPED_TEST(CommunicatorTypedTest, AllGather) {
  using T = TypeParam;
  const int world = this->world(), me = this->rank();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
    std::vector<T> send(count), recv(count * world);
    for (size_t i = 0; i < count; ++i) send[i] = as<T>(value_of(me, i, 1));
    ASSERT_TRUE(AllGather<T>(this->comm(), send, absl::MakeSpan(recv)).ok());
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(back(recv[r * count + i]), value_of(r, i, 1)) << "count " << count << " r " << r;
      }
    }
  }
}

TYPED_TEST(CommunicatorTypedTest, AllGatherV) {
  using T = TypeParam;
  const int world = this->world(), me = this->rank();
  std::vector<size_t> counts(world);
  for (int r = 0; r < world; ++r) counts[r] = (r % 3 == 1) ? 0 : size_t(r * 5 + 3);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<T> send(counts[me]), recv(total);
  for (size_t i = 0; i < send.size(); ++i) send[i] = as<T>(value_of(me, i, 2));
  ASSERT_TRUE(this->comm()
                  .AllGatherV(send.data(), send.size(), recv.data(), counts, dtype_of<T>())
                  .ok());
  size_t offset = 0;
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < counts[r]; ++i) ASSERT_EQ(back(recv[offset + i]), value_of(r, i, 2));
    offset += counts[r];
  }
}

TYPED_TEST(CommunicatorTypedTest, ReduceScatterSum) {
  using T = TypeParam;
  const int world = this->world(), me = this->rank();
  for (size_t count : {size_t{1}, size_t{33}, size_t{2048}}) {
    std::vector<T> send(count * world), recv(count);
    for (int q = 0; q < world; ++q) {
      for (size_t i = 0; i < count; ++i) send[q * count + i] = as<T>(value_of(me, i + q * 3, 3));
    }
    ASSERT_TRUE(ReduceScatterSum<T>(this->comm(), send, absl::MakeSpan(recv)).ok());
    for (size_t i = 0; i < count; ++i) {
      double expected = 0;
      for (int r = 0; r < world; ++r) expected += value_of(r, i + me * 3, 3);
      ASSERT_EQ(back(recv[i]), expected) << "count " << count << " i " << i;
    }
  }
}

TYPED_TEST(CommunicatorTypedTest, AllToAll) {
  using T = TypeParam;
  const int world = this->world(), me = this->rank();
  const size_t count = 37;
  std::vector<T> send(count * world), recv(count * world);
  // Block q of rank r's send carries value_of(r, i, salt 10 + q).
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < count; ++i) send[q * count + i] = as<T>(value_of(me, i, 10 + q));
  }
  ASSERT_TRUE(AllToAll<T>(this->comm(), send, absl::MakeSpan(recv)).ok());
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(back(recv[q * count + i]), value_of(q, i, 10 + me));
  }
}

TYPED_TEST(CommunicatorTypedTest, AllToAllV) {
  using T = TypeParam;
  const int world = this->world(), me = this->rank();
  // Rank r sends (r + q) % 4 elements to rank q, some of them none.
  auto count_of = [](int from, int to) { return size_t((from + to) % 4); };
  std::vector<size_t> send_counts(world), send_displs(world), recv_counts(world), recv_displs(world);
  size_t send_total = 0, recv_total = 0;
  for (int q = 0; q < world; ++q) {
    send_counts[q] = count_of(me, q);
    send_displs[q] = send_total;
    send_total += send_counts[q];
    recv_counts[q] = count_of(q, me);
    recv_displs[q] = recv_total;
    recv_total += recv_counts[q];
  }
  std::vector<T> send(send_total), recv(recv_total);
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < send_counts[q]; ++i) send[send_displs[q] + i] = as<T>(value_of(me, i, 20 + q));
  }
  ASSERT_TRUE(this->comm()
                  .AllToAllV(send.data(), send_counts, send_displs, recv.data(), recv_counts,
                             recv_displs, dtype_of<T>())
                  .ok());
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < recv_counts[q]; ++i) {
      ASSERT_EQ(back(recv[recv_displs[q] + i]), value_of(q, i, 20 + me));
    }
  }
}

class CommunicatorTest : public MultiRankTest {};

TEST_F(CommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < world(); ++root) {
    std::vector<uint8_t> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(rank() == root ? (i * 7 + root) : 0xff);
    ASSERT_TRUE(comm().Broadcast(data.data(), data.size(), root).ok());
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], uint8_t(i * 7 + root));
    int64_t word = rank() == root ? 1000 + root : -1;
    ASSERT_TRUE(comm().HostBroadcast(&word, sizeof(word), root).ok());
    EXPECT_EQ(word, 1000 + root);
  }
}

TEST_F(CommunicatorTest, BarrierAndHostAllGather) {
  ASSERT_TRUE(comm().Barrier().ok());
  std::vector<int64_t> values(world());
  ASSERT_TRUE(comm().HostAllGather(int64_t{1} << (40 + rank()), absl::MakeSpan(values)).ok());
  for (int r = 0; r < world(); ++r) EXPECT_EQ(values[r], int64_t{1} << (40 + r));
}

TEST_F(CommunicatorTest, AgreeOnStatusSharesTheLowestFailingRank) {
  EXPECT_TRUE(AgreeOnStatus(comm(), absl::OkStatus()).ok());
  const int failing = world() - 1;
  absl::Status local = rank() >= failing ? absl::InvalidArgumentError("bad input on the last rank")
                                         : absl::OkStatus();
  absl::Status shared = AgreeOnStatus(comm(), local);
  EXPECT_EQ(shared.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shared.message(), "bad input on the last rank");
}

TEST_F(CommunicatorTest, WrongSizesAreErrors) {
  std::vector<float> send(3), recv(1);
  EXPECT_EQ(AllGather<float>(comm(), send, absl::MakeSpan(recv)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<size_t> counts(world() + 1, 0);
  EXPECT_EQ(comm().AllGatherV(send.data(), 0, recv.data(), counts, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm().HostBroadcast(send.data(), 4, world()).code(),
            absl::StatusCode::kInvalidArgument);
  // A count past MPI's int limit is refused before anything is staged (ReduceScatterSum staged
  // world x count elements first: 2^40 of them threw bad_alloc and aborted every rank).
  EXPECT_EQ(comm().ReduceScatterSum(nullptr, nullptr, size_t{1} << 40, DType::kF32).code(),
            absl::StatusCode::kInvalidArgument);
}

// The stream-order calls on host-memory backends (MPI, world of one): host completion in either
// mode, a null stream only, and the rest no-ops, so a caller can bind every backend alike.
TEST_F(CommunicatorTest, HostBackendsKeepHostCompletion) {
  LocalCommunicator local;
  for (Communicator* backend : {static_cast<Communicator*>(&comm()),
                                static_cast<Communicator*>(&local)}) {
    SCOPED_TRACE(backend->name());
    EXPECT_EQ(backend->completion(), Completion::kHost);
    EXPECT_TRUE(backend->BindStream(nullptr, Completion::kStream).ok());
    EXPECT_EQ(backend->completion(), Completion::kHost);
    int not_a_stream = 0;
    const absl::Status refused = backend->BindStream(&not_a_stream, Completion::kStream);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find("host memory"), std::string::npos) << refused;
    EXPECT_EQ(backend->BindStream(nullptr, static_cast<Completion>(7)).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(backend->Synchronize().ok());
    EXPECT_TRUE(backend->WatchStream("nothing to watch").ok());
    EXPECT_TRUE(backend->ReserveReduceScatter(1 << 20, DType::kBF16).ok());
  }
  // Still a working communicator afterwards.
  std::vector<int64_t> values(world());
  ASSERT_TRUE(comm().HostAllGather(rank(), absl::MakeSpan(values)).ok());
  for (int r = 0; r < world(); ++r) EXPECT_EQ(values[r], r);
}

// A collective that a peer joins late is a DeadlineExceeded error, not a hang, and the
// communicator refuses further work.
TEST_F(CommunicatorTest, MissingPeerTimesOut) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  // The buffers outlive the communicator: a timed-out collective completes (writing recv)
  // when the late peer arrives, at the latest in the communicator's destructor.
  std::vector<float> send(4, 1.0f), recv(4 * world());
  auto made = MpiCommunicator::Create(MPI_COMM_WORLD, /*timeout_s=*/0.3);
  ASSERT_TRUE(made.ok());
  auto late = std::move(made).value();
  if (rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    // Rank 0 arrives after its peers gave up; with the same short timeout it may or may not
    // complete, but it must return.
    (void)late->AllGather(send.data(), recv.data(), 4, DType::kF32);
  } else {
    absl::Status status = late->AllGather(send.data(), recv.data(), 4, DType::kF32);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_NE(status.message().find("did not complete"), std::string::npos) << status;
    EXPECT_EQ(late->Barrier().code(), absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace dcp::testing
