#!/bin/bash
TREE=$1; OUT=$2; mkdir -p $OUT; cd $TREE
export PYTHONPATH=$TREE/benchmarks
T="python benchmarks/scalar_trace.py run"
SMALL="--config configs/compare/grpo_rspo.yaml --config configs/smoke.yaml"
S="--data.iterations_per_epoch=7 --trainer.max_epochs=1 --data.groups_per_iteration=4 --data.group_size=4 --model.rollout.max_turns=6"
CB="--trainer.callbacks.init_args"
STUDY="--trainer.callbacks.class_path=study_loop.StudyRSPOLoop"
small() { name=$1; shift; [ -f $OUT/$name.json ] || $T $SMALL --out $OUT/$name.json -- $S "$@"; }
small levers $STUDY $CB.explorer_lr_scale=2.0 $CB.explorer_temperature=1.3 $CB.explorer_credit=turn $CB.explorer_resync_every=2 $CB.reuse_a_episodes=true --trainer.max_epochs=2
small combo_d $STUDY $CB.replay_from=both $CB.buffer_from=explore+collect $CB.replay_slots=positive $CB.k=1 $CB.exploit_k=3
small nocollect_signal $STUDY $CB.buffer_from=explore+collect $CB.collect_phase=false $CB.offline_weighting=signal
small paper
small online $STUDY $CB.replay_baseline=online $CB.replay_unit=group $CB.explorer_reward=outcome+dense $CB.dense_scale=10
small rspo_h $CB.replay_from=history
small shaped_grpo --data.reward_mode=outcome+dense --data.dense_scale=10 --trainer.callbacks=[]
[ -f $OUT/grpo_rspo_loop.json ] || $T --config configs/compare/grpo_rspo.yaml --out $OUT/grpo_rspo_loop.json -- --trainer.max_epochs=1
echo done
