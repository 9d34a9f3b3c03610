# PPO with a learned critic (seed 003, "PPO (the contrast baseline)"): the objective GRPO simplified. A value
# model (the policy's base network + a scalar head) gives V(s_t) before every token; GAE turns the outcome
# reward on the last token into per-token advantages; the critic learns a clipped value loss beside the policy.
exec(open('config/gpu_base.py').read())
out_dir = 'out/ppo'
loss_type = 'ppo'
gae_lambda = 0.95                  # the classic PPO lambda; VAPO shows why the critic wants 1.0 on long answers
critic_lr = 2e-6                   # 2x the actor's, as VAPO
vf_clip = 0.5
value_warmup_steps = 0             # plain PPO: critic and policy start together
