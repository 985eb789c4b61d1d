// dpe train: trains a built-in model in single, DP or DDP mode, with a progress line, test accuracy per
// epoch, checkpoints every N epochs (replica 0 only, atomic) and resume.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "data/data_loader.h"
#include "engine/checkpoint.h"
#include "models/models.h"
#include "optim/lr_scheduler.h"
#include "tools/dpe/cli_util.h"
#include "tools/dpe/commands.h"
#include "tools/dpe/progress.h"
#include "tools/dpe/training.h"

namespace dpe::tool {

namespace {

struct TrainArgs {
  EngineOptions engine;
  OptimizerOptions optimizer;
  std::string device_ids, output_device, data_dir, json;
  std::string checkpoint = "dpe_checkpoint.safetensors";
  std::string schedule = "cosine";
  int64_t batch_size = 128, epochs = 10, limit = -1, save_every = 0;
  int cpu_devices = 2;
};

void run_train(TrainArgs args) {
  args.engine.devices = args.device_ids.empty() ? default_devices(args.cpu_devices) : parse_device_list(args.device_ids);
  if (!args.output_device.empty()) args.engine.output_device = Device::parse(args.output_device);
  DPE_CHECK(args.batch_size > 0 && args.epochs > 0, "--batch-size ", args.batch_size, " and --epochs ", args.epochs,
            ": expected positive values");
  ModelData data = load_model_data(args.engine.model, args.data_dir, args.limit);
  int64_t first_epoch = 0;
  std::unique_ptr<DataParallel> dp = make_engine(args.engine, args.optimizer, &first_epoch);
  LossFn loss_fn = models::model_loss(args.engine.model);
  // Batches for GPUs are gathered into pinned memory, so that the scatter's copies are asynchronous DMA.
  const bool to_cuda = std::ranges::any_of(dp->device_ids(), [](const Device& d) { return d.is_cuda(); });
  data::DataLoader loader(data.train_inputs, data.train_targets,
                          {.batch_size = args.batch_size, .seed = args.engine.seed, .prefetch = 2,
                           .pin_memory = to_cuda});
  std::printf("dpe train: %s, mode %s on %s, global batch %lld, %lld training samples, %lld test samples%s\n",
              args.engine.model.c_str(), args.engine.mode.c_str(), device_list_str(dp->device_ids()).c_str(),
              static_cast<long long>(args.batch_size), static_cast<long long>(data.train_inputs.size(0)),
              static_cast<long long>(data.test_inputs.size(0)),
              first_epoch > 0 ? (" (resumed after epoch " + std::to_string(first_epoch) + ")").c_str() : "");
  std::fflush(stdout);  // before the progress lines on stderr
  // One scheduler per optimizer (DDP: per replica, so every replica keeps the same learning rate), stepped
  // after every optimizer step; a resumed run fast-forwards it to where the checkpoint stopped.
  std::vector<std::unique_ptr<optim::LRScheduler>> schedulers;
  if (args.schedule == "cosine") {
    for (size_t r = 0; r < dp->num_optimizers(); ++r) {
      // A resumed optimizer holds the decayed rate; the schedule starts from --lr and is replayed below.
      for (optim::ParamGroup& group : dp->optimizer(r).param_groups()) group.lr = args.optimizer.lr;
      schedulers.push_back(std::make_unique<optim::CosineWithWarmup>(dp->optimizer(r), 0, args.epochs * loader.num_batches()));
    }
  }
  for (int64_t s = 0; s < first_epoch * loader.num_batches(); ++s) {
    for (auto& scheduler : schedulers) scheduler->step();
  }
  std::string epochs_json;
  double accuracy = 0;
  for (int64_t epoch = first_epoch; epoch < args.epochs; ++epoch) {
    loader.begin_epoch(epoch);
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(args.epochs), loader.num_batches());
    auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t samples = 0, steps = 0;
    while (std::optional<data::Batch> batch = loader.next()) {
      double loss = dp->train_step(batch->inputs, batch->targets, loss_fn);
      for (auto& scheduler : schedulers) scheduler->step();
      loss_sum += loss * static_cast<double>(batch->inputs.size(0));
      samples += batch->inputs.size(0);
      progress.update(++steps, loss_sum / static_cast<double>(samples), samples);
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    accuracy = test_accuracy(*dp, args.engine.model, data.test_inputs, data.test_targets);
    double rate = static_cast<double>(samples) / seconds;
    char summary[160];
    std::snprintf(summary, sizeof summary, "loss %.4f  test accuracy %.4f  %.0f samples/s  %.1f s",
                  loss_sum / static_cast<double>(samples), accuracy, rate, seconds);
    progress.finish(summary);
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s{\"epoch\": %lld, \"train_loss\": %.6f, \"test_accuracy\": %.6f, \"samples_per_s\": %.2f, "
                  "\"seconds\": %.3f}",
                  epochs_json.empty() ? "" : ", ", static_cast<long long>(epoch + 1),
                  loss_sum / static_cast<double>(samples), accuracy, rate, seconds);
    epochs_json += row;
    if (args.save_every > 0 && ((epoch + 1) % args.save_every == 0 || epoch + 1 == args.epochs)) {
      // Replicas are identical (DDP) or the master holds the model (DP): replica 0 is the model.
      engine::save_checkpoint(args.checkpoint, dp->module(), &dp->optimizer(0),
                              {.epoch = epoch + 1, .step = (epoch + 1) * loader.num_batches()});
      std::fprintf(stderr, "saved %s (epoch %lld)\n", args.checkpoint.c_str(), static_cast<long long>(epoch + 1));
    }
  }
  std::printf("final test accuracy %.4f\n", accuracy);
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    DPE_CHECK(out.good(), "--json ", args.json, ": cannot open for writing");
    out << "{\"model\": \"" << args.engine.model << "\", \"mode\": \"" << args.engine.mode << "\", \"devices\": \""
        << device_list_str(dp->device_ids()) << "\", \"batch_size\": " << args.batch_size
        << ", \"final_test_accuracy\": " << accuracy << ", \"epochs\": [" << epochs_json << "]}\n";
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a built-in model (mlp, cnn, tiny-llama) in single, DP or DDP mode");
  cmd->add_option("--model", args->engine.model, "model")->check(CLI::IsMember(models::kModelNames));
  cmd->add_option("--mode", args->engine.mode, "single device, DataParallel or DistributedDataParallel")
      ->check(CLI::IsMember(kModes));
  cmd->add_option("--device-ids", args->device_ids, "devices (default: every CUDA device, else --cpu-devices CPU devices)");
  cmd->add_option("--cpu-devices", args->cpu_devices, "CPU devices when no --device-ids and no GPU")->check(CLI::PositiveNumber);
  cmd->add_option("--output-device", args->output_device, "where DP gathers outputs (default: the first device)");
  cmd->add_option("--batch-size", args->batch_size, "global batch (split across the devices)");
  cmd->add_option("--epochs", args->epochs, "epochs");
  cmd->add_option("--lr", args->optimizer.lr, "learning rate");
  cmd->add_option("--optimizer", args->optimizer.name, "optimizer")->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd->add_option("--momentum", args->optimizer.momentum, "SGD momentum");
  cmd->add_option("--schedule", args->schedule, "learning rate: constant, or cosine decay to 0 over the run (per step)")
      ->check(CLI::IsMember({"constant", "cosine"}));
  cmd->add_option("--weight-decay", args->optimizer.weight_decay, "weight decay");
  cmd->add_flag("--sync-bn", args->engine.sync_bn, "DDP: BatchNorm layers become SyncBatchNorm");
  cmd->add_option("--seed", args->engine.seed, "initial weights and data order");
  cmd->add_option("--limit", args->limit, "use only the first N training samples");
  cmd->add_option("--data-dir", args->data_dir, "Fashion-MNIST directory, or the text file for tiny-llama");
  cmd->add_option("--save-every", args->save_every, "checkpoint every N epochs and at the end (replica 0, atomic)");
  cmd->add_option("--checkpoint", args->checkpoint, "checkpoint path for --save-every");
  cmd->add_option("--resume", args->engine.resume, "continue from this checkpoint (the epoch after the saved one)");
  cmd->add_option("--json", args->json, "write the final report as JSON to this file");
  cmd->callback([args] { run_train(*args); });
}

}  // namespace dpe::tool
